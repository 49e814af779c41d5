"""One active operator among the chart's replicas: leader election on a ``coordination.k8s.io`` Lease, as
controller-runtime's managers elect theirs (client-go's ``leaderelection``).

- **Acquire**: create the Lease, or take it over when its holder let it lapse: its record unchanged for its
  ``leaseDurationSeconds`` as *this* process observed it (client-go's rule: no trust in another machine's clock),
  or released (no holder). Every write carries the resourceVersion read, so two candidates never both win.
- **Hold**: renew every ``retry_s``. A leader whose renewals have failed for ``renew_deadline_s`` exits at once
  (controller-runtime's "leader election lost"): it stops before anyone may take over, since the deadline is
  shorter than the lease.
- **Release** on a graceful stop (SIGTERM, the Deployment's rollout): the holder is emptied, so a standby takes
  over at its next try instead of after the lease.

A standby does nothing but try (and answer ``/healthz`` and ``/readyz``, so its probes pass); the handlers start only
in the leader. The identity is the pod's name (``POD_NAME``, from the downward API): a container restarted in its pod
takes its own Lease back at once. Figures: takeover after a leader is killed within ``lease_s + retry_s`` (12 s).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from atlas_operator.kube import LEASE, ApiError, Kube

log = logging.getLogger("atlas_operator")

LEASE_S = 10
RENEW_DEADLINE_S = 7.0
RETRY_S = 2.0


def identity() -> str:
    """This replica's name: its pod's (the chart's ``POD_NAME``), else host and process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Elector:
    kube: Kube
    namespace: str
    name: str
    holder: str = field(default_factory=identity)
    lease_s: int = LEASE_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_s: float = RETRY_S
    # (resourceVersion, monotonic time) of the Lease record as this process last saw it change.
    _observed: tuple[str, float] = ("", 0.0)
    _renewed_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    # ------------------------------------------------------------------ one try

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this process holds the Lease afterwards."""
        lease = self.kube.get_fresh(LEASE, self.namespace, self.name)
        now = time.monotonic()
        spec = {"holderIdentity": self.holder, "leaseDurationSeconds": self.lease_s, "renewTime": _micro_time()}
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0},
            }
            return self._write(lambda: self.kube.create(body, LEASE))
        current = lease.get("spec") or {}
        version = lease["metadata"]["resourceVersion"]
        if version != self._observed[0]:
            self._observed = (version, now)
        held_by = current.get("holderIdentity") or ""
        if held_by and held_by != self.holder:
            lapsed = now - self._observed[1] > float(current.get("leaseDurationSeconds") or self.lease_s)
            if not lapsed:
                return False
        if held_by != self.holder:
            spec["acquireTime"] = spec["renewTime"]
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        patch = {"metadata": {"resourceVersion": version}, "spec": spec}
        return self._write(lambda: self.kube.patch(LEASE, self.namespace, self.name, patch))

    def _write(self, call: Callable[[], dict[str, Any]]) -> bool:
        try:
            written = call()
        except ApiError as exc:
            if exc.conflict:  # another candidate wrote first
                return False
            raise
        self._observed = (written["metadata"]["resourceVersion"], time.monotonic())
        return True

    # ------------------------------------------------------------------ the life of a replica

    def acquire(self, health_port: int = 0, health_host: str = "0.0.0.0") -> None:
        """Block until this process leads; meanwhile answer ``/healthz`` and ``/readyz`` on ``health_port`` (0:
        nothing)."""
        server = _health_server(health_host, health_port) if health_port else None
        waiting_for = None
        try:
            while True:
                try:
                    if self.try_acquire_or_renew():
                        break
                except (ApiError, OSError) as exc:
                    log.warning("leader election: %s", exc)
                lease = None
                try:
                    lease = self.kube.get_fresh(LEASE, self.namespace, self.name)
                except (ApiError, OSError):
                    pass
                leader = ((lease or {}).get("spec") or {}).get("holderIdentity")
                if leader != waiting_for:
                    log.info("leader election: standing by, %s leads (Lease %s/%s)", leader, self.namespace, self.name)
                    waiting_for = leader
                time.sleep(self.retry_s)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
        self._renewed_at = time.monotonic()
        log.info("leader election: %s leads (Lease %s/%s)", self.holder, self.namespace, self.name)

    def hold(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a thread of its own; ``on_lost()`` once renewals have failed for the renew deadline."""

        def loop() -> None:
            while not self._stop.wait(self.retry_s):
                try:
                    if self.try_acquire_or_renew():
                        self._renewed_at = time.monotonic()
                except (ApiError, OSError) as exc:
                    log.warning("leader election: renewal failed: %s", exc)
                if time.monotonic() - self._renewed_at > self.renew_deadline_s:
                    log.error(
                        "leader election lost: no renewal of Lease %s/%s for %.0f s; exiting",
                        self.namespace,
                        self.name,
                        self.renew_deadline_s,
                    )
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="leader-election", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the Lease up (a graceful stop): a standby takes it at its next try."""
        self._stop.set()
        try:
            lease = self.kube.get_fresh(LEASE, self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.holder:
                patch = {
                    "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
                }
                self.kube.patch(LEASE, self.namespace, self.name, patch)
                log.info("leader election: released Lease %s/%s", self.namespace, self.name)
        except (ApiError, OSError) as exc:
            log.warning("leader election: could not release the Lease: %s", exc)


def _health_server(host: str, port: int) -> ThreadingHTTPServer:
    """``/healthz`` and ``/readyz`` for a standby: its liveness and readiness probes pass while it waits (a standby
    is ready to take over: a Deployment of two replicas rolls out)."""

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            # a standby's /metrics: no samples (the leader's count)
            known = self.path in ("/healthz", "/readyz", "/metrics")
            body = b"ok (standby)" if self.path in ("/healthz", "/readyz") else b""
            self.send_response(200 if known else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Health)
    threading.Thread(target=server.serve_forever, name="standby-healthz", daemon=True).start()
    return server
