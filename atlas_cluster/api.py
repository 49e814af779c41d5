"""The one client of the local cluster's API: plain JSON requests (dicts in, dicts out) with one kubeconfig's
credentials, through the kubernetes package's connection handling (TLS, client certificates, tokens) and none of
its models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes


class Api:
    """Plain JSON requests (dicts in, dicts out) with one kubeconfig's credentials."""

    def __init__(self, config: Path):
        self.client = kubernetes.config.new_client_from_config(str(config))

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self.client.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
        data = response.read()
        try:
            return response.status, json.loads(data) if data else {}
        except ValueError:
            return response.status, {"raw": data[:500]}

    def ok(self, method: str, path: str, body: Any = None, **kwargs) -> dict:
        status, data = self.call(method, path, body, **kwargs)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data.get('message', data)}")
        return data
