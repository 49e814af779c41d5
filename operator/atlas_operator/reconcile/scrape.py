"""The Running trainer's numbers from its /metrics: bounded in time and size, in a small pool of their own."""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from atlas_contract.names import ChildNames
from atlas_operator.config import OperatorConfig
from atlas_operator.status_update import parse_progress
from atlas_operator.tracking_status import parse_tracking

log = logging.getLogger("atlas_operator")

MAX_METRICS_BYTES = 1 << 20  # a trainer's /metrics is a few KB; more is not a metrics endpoint
SCRAPERS = 8  # threads: each run's timer awaits its own scrape, so one in flight per run


class Scraping:
    """Reads of the trainers' metrics endpoints, in a small pool of their own (not the reconciliations')."""

    def __init__(self, settings: OperatorConfig):
        self.settings = settings
        self._pool = ThreadPoolExecutor(max_workers=SCRAPERS, thread_name_prefix="atlas-scrape")

    def metrics_url(self, name: str, namespace: str) -> str:
        return self.settings.metrics_url_template.format(
            name=name,
            namespace=namespace,
            service=ChildNames(name).metrics,
            port=self.settings.trainer_metrics_port,
        )

    async def scrape(self, meta: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The Running trainer's step/reward/kl and its tracking (tracking_status.parse_tracking) from its
        /metrics, or (None, None) when it does not answer (not up, too slow or big, not metrics). Each read is bounded
        in time and size and runs in the scrapers' own small pool, so a trainer that trickles or floods its endpoint
        delays only its own run's timer."""
        name, namespace = meta["name"], meta.get("namespace", "default")
        url = self.metrics_url(name, namespace)
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(
                self._pool, fetch_text, url, self.settings.scrape_timeout_s, MAX_METRICS_BYTES
            )
            return parse_progress(text, name, namespace) or None, parse_tracking(text, name, namespace)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            log.debug("metrics of %s/%s not readable at %s: %s", namespace, name, url, exc)
            return None, None


def fetch_text(url: str, deadline_s: float, max_bytes: int) -> str:
    """GET ``url`` within ``deadline_s`` for the whole request (not per read) and at most ``max_bytes``."""
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    if parts.hostname is None:  # the operator's metrics URL template is wrong: loud, not a skipped scrape
        raise RuntimeError(f"no host in the trainer's metrics URL {url}")
    end = time.monotonic() + deadline_s
    connection = connection_class(parts.hostname, parts.port, timeout=deadline_s)
    try:
        connection.request("GET", parts.path or "/")
        sock = connection.sock  # the response reads through it (the connection may drop its reference)
        response = connection.getresponse()
        if response.status != 200:
            raise OSError(f"HTTP {response.status}")
        body = bytearray()
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete answer within {deadline_s:g} s")
            sock.settimeout(remaining)
            chunk = response.read1(65536)
            if not chunk:
                return body.decode("utf-8", "replace")
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"answer larger than {max_bytes} bytes")
    finally:
        connection.close()
