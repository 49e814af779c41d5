"""A real Prometheus server (Debian's ``prometheus`` package, 2.42) on 127.0.0.1 for tests, and Grafana's
variable substitution, so that dashboard queries run as Grafana would send them.

``make test`` installs the package when it runs as root on Debian; elsewhere the tests that need it skip with
:data:`MISSING` (what to install).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

MISSING = (
    "the Prometheus server and promtool are not installed: `apt-get install prometheus` (Debian; `make test` "
    "does it when run as root) or put `prometheus` and `promtool` from prometheus.io on PATH"
)


def binaries() -> tuple[str, str] | None:
    """(prometheus, promtool) from PATH, or None."""
    server, promtool = shutil.which("prometheus"), shutil.which("promtool")
    return (server, promtool) if server and promtool else None


class Prometheus:
    """``prometheus`` with one-second scrapes and rule evaluation; ``scrape_configs`` as in prometheus.yml.

    Targets that change during a test go in a file_sd file (:meth:`set_file_targets`), which Prometheus
    re-reads when it changes."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path] = ()):
        from harness.env import free_port

        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(p) for p in rule_files],
                    "scrape_configs": scrape_configs,
                },
                sort_keys=False,
            )
        )
        self.log = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def file_sd(self, name: str) -> Path:
        return self.workdir / f"{name}.json"

    def set_file_targets(self, name: str, targets: list[str], labels: dict[str, str]) -> None:
        """Rewrite a file_sd file atomically (Prometheus watches it)."""
        tmp = self.file_sd(name).with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": targets, "labels": labels}]))
        tmp.replace(self.file_sd(name))

    def start(self, timeout: float = 60) -> Prometheus:
        found = binaries()
        if not found:
            raise RuntimeError(MISSING)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    found[0],
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns ``data`` (raises on an error status, with Prometheus' own message)."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code} {exc.read().decode(errors='replace')}") from None
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        assert data["resultType"] == "matrix", data
        return data["result"]

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        return self.api(f"label/{label}/values", **{"match[]": match, "start": start, "end": end})

    def targets_up(self) -> dict[str, str]:
        """scrapeUrl → health of every active target."""
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]


def finite_points(series: list[dict[str, Any]]) -> int:
    """How many samples of a range result are numbers (Grafana draws nothing for NaN)."""
    return sum(1 for s in series for _, v in s["values"] if math.isfinite(float(v)))


# ----------------------------------------------------------------------------- Grafana's side of a query

_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|\[\]{}])")


def grafana_interval(range_s: float, max_data_points: int, min_interval_s: float) -> float:
    """``$__interval``: the time range over the panel's data points, never below the data source's scrape
    interval (Grafana also rounds it to a "nice" value; at these ranges the minimum wins)."""
    return max(range_s / max_data_points, min_interval_s)


def grafana_expr(expr: str, variables: dict[str, list[str]], interval_s: float, scrape_interval_s: float) -> str:
    """The PromQL Grafana sends: ``$__rate_interval`` = max($__interval + scrape interval, 4 × scrape interval),
    ``$__interval``, and template variables as its Prometheus data source interpolates them inside ``=~``:
    values regex-escaped, several joined as ``(a|b)``."""
    rate_interval = max(interval_s + scrape_interval_s, 4 * scrape_interval_s)
    text = expr.replace("$__rate_interval", f"{int(math.ceil(rate_interval * 1000))}ms")
    text = text.replace("$__interval", f"{int(math.ceil(interval_s * 1000))}ms")
    for name, values in variables.items():
        escaped = [_REGEX_SPECIAL.sub(r"\\\\\1", v) for v in values]
        value = escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"
        text = text.replace(f"${{{name}}}", value).replace(f"${name}", value)
    leftover = re.findall(r"\$\{?\w+", text)
    assert not leftover, f"unsubstituted variables {leftover} in {text}"
    return text
