"""etcd, kube-apiserver and kube-controller-manager as processes on 127.0.0.1 — controller-runtime's envtest
control plane, plus the controller manager (garbage collector, namespace, service-account and token controllers:
what a real cluster does to a run's children after the operator is gone).

Authentication is by client certificate (the admin in ``system:masters``) and by service-account token
(TokenRequest, signed with the cluster's key); authorization is RBAC only, so what the operator may do is what its
chart grants, judged by the real authorizer.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from atlas_cluster.build import REQUIRED, missing
from atlas_cluster.pki import make_pki
from atlas_cluster.processes import Supervisor

SERVICE_CIDR = "10.96.0.0/16"  # what kind and kubeadm use: room for every run's Services
ISSUER = "https://kubernetes.default.svc.cluster.local"
READY_TIMEOUT = 60.0
# The audit log records every request of a ServiceAccount outside kube-system (the operator's, the controllers'
# of the next tier) with its verb, resource and response code: what RBAC refused is read from it, not guessed from a
# client's logs. Everything else (the control plane's own traffic) is not recorded.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}
# The Go runtime's collector at a quarter of its default pace for the local cluster's Go processes (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, the backends' controllers):
# on 2 cores shared with the operator and the trainers, a burst of runs spent half the API server's CPU in the Go
# runtime, allocating and collecting (bench/operator_throughput.py --api real: the API server's CPU for 100 runs,
# 10.3-11.1 s at the default 100, 7.5-7.6 s at 400), for more heap between collections.
GO_GC_PERCENT = "400"
# Stopped in this order: what depends on the API server first, etcd last.
STOP_ORDER = ("kube-controller-manager", "kube-apiserver", "etcd")


def go_env() -> dict[str, str]:
    """Our environment for a control-plane process, with GO_GC_PERCENT (a GOGC already set is kept)."""
    return {"GOGC": GO_GC_PERCENT, **os.environ}


# Ports this process has handed out: the kernel may give a just-released port again, and a
# controller whose metrics and health ports came out equal exits at start (seen in CI).
_ISSUED_PORTS: set[int] = set()


def free_port() -> int:
    """A free port on 127.0.0.1 that this process has not handed out before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ISSUED_PORTS:
            _ISSUED_PORTS.add(port)
            return port


@dataclass
class Endpoints:
    api_port: int
    etcd_port: int
    etcd_peer_port: int

    @classmethod
    def pick(cls) -> Endpoints:
        return cls(free_port(), free_port(), free_port())

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"


def kubeconfig(server: str, ca: Path, user: dict[str, str], name: str = "atlas") -> dict:
    """A kubeconfig of one cluster, one user (``client-certificate``/``client-key`` or ``token``) and one context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def write_kubeconfig(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class ControlPlane:
    """One control plane in ``directory`` (``pki/``, ``etcd/``, ``logs/``, ``admin.kubeconfig``)."""

    def __init__(
        self,
        directory: Path,
        bin_dir: Path,
        supervisor: Supervisor | None = None,
        apiserver_args: Sequence[str] = (),
    ):
        self.directory = directory
        self.bin_dir = bin_dir
        self.supervisor = supervisor or Supervisor(directory)
        self.apiserver_args = tuple(apiserver_args)  # extra kube-apiserver flags, after ours (the last one wins)
        self.pki = directory / "pki"
        self.endpoints: Endpoints | None = None
        self.ready_after: dict[str, float] = {}  # process → seconds from its start to ready

    @property
    def admin_kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one per request of a ServiceAccount outside kube-system (AUDIT_POLICY)."""
        return self.directory / "logs" / "audit.log"

    def audit_mark(self) -> int:
        """Where the audit log ends now: ``audit_events(since=...)`` then reads only what comes after."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit_events(self, since: int = 0) -> list[dict]:
        """The audit log's entries from byte ``since``; a line the API server is still writing is left out (the
        next read has it)."""
        if not self.audit_log.exists():
            return []
        with open(self.audit_log, "rb") as log:
            log.seek(since)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    @property
    def server(self) -> str:
        assert self.endpoints is not None, "not started"
        return self.endpoints.server

    def start(self, controller_manager: bool = True) -> ControlPlane:
        """etcd and kube-apiserver, ready; then the controller manager unless told not to (start it with
        ``start_controller_manager`` once the CRDs are in: its garbage collector discovers resource kinds only
        every 30 s, so kinds installed after it are not collected until then)."""
        absent = missing(self.bin_dir, REQUIRED)
        if absent:
            raise FileNotFoundError(f"{', '.join(absent)} not in {self.bin_dir}")
        make_pki(self.pki)
        self.endpoints = endpoints = Endpoints.pick()
        self._timed("etcd", self._start_etcd, endpoints)
        self._timed("kube-apiserver", self._start_apiserver, endpoints)
        write_kubeconfig(
            self.admin_kubeconfig,
            kubeconfig(
                endpoints.server,
                self.pki / "ca.crt",
                {"client-certificate": str(self.pki / "admin.crt"), "client-key": str(self.pki / "admin.key")},
            ),
        )
        if controller_manager:
            self.start_controller_manager()
        return self

    def start_controller_manager(self) -> None:
        if not missing(self.bin_dir, ("kube-controller-manager",)):  # an envtest folder may lack it
            self._timed("kube-controller-manager", self._start_controller_manager, self.endpoints)

    def _timed(self, name: str, start, endpoints: Endpoints) -> None:
        started = time.monotonic()
        start(endpoints)
        self.ready_after[name] = time.monotonic() - started

    def stop(self) -> None:
        self.supervisor.stop_all(STOP_ORDER)

    # ------------------------------------------------------------------ faults

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver, as a crash: every client's connection reset, no graceful shutdown."""
        self.supervisor.kill("kube-apiserver")

    def start_apiserver(self, apiserver_args: Sequence[str] | None = None) -> None:
        """kube-apiserver (again, after ``kill_apiserver``) on the same ports, certificates, etcd and audit log;
        ``apiserver_args`` replaces the extra flags when given. Returns once it is ready."""
        if apiserver_args is not None:
            self.apiserver_args = tuple(apiserver_args)
        assert self.endpoints is not None, "not started"
        self._timed("kube-apiserver", self._start_apiserver, self.endpoints)

    def etcd(self, path: str, body: dict) -> dict:
        """One call to etcd's JSON gateway (``/v3/kv/range``, ``/v3/kv/compaction``…): keys are base64."""
        assert self.endpoints is not None, "not started"
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.endpoints.etcd_port}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def etcd_revision(self) -> int:
        return int(self.etcd("/v3/kv/range", {"key": "AA=="})["header"]["revision"])

    def compact_etcd(self) -> int:
        """etcd's history compacted up to its current revision (physical: done when this returns): a watch from an
        older resourceVersion that etcd serves gets 410 Gone. Returns the revision."""
        revision = self.etcd_revision()
        self.etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ------------------------------------------------------------------ the processes

    def _start_etcd(self, ep: Endpoints) -> None:
        client = f"http://127.0.0.1:{ep.etcd_port}"
        self.supervisor.start(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls=http://127.0.0.1:{ep.etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ep.etcd_peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{ep.etcd_peer_port}",
                "--unsafe-no-fsync",  # a test cluster: losing it on a power cut is fine, waiting on fsync is not
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            env=go_env(),
        )
        self.supervisor.wait_until("etcd", lambda: _http_ok(f"{client}/health"), READY_TIMEOUT, "etcd")

    def _start_apiserver(self, ep: Endpoints) -> None:
        pki = self.pki
        policy = self.directory / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        self.supervisor.start(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ep.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ep.api_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=false",
                "--endpoint-reconciler-type=none",  # its endpoint would be 127.0.0.1, which Endpoints refuse
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                # Written by the request's own handler (not batched), just after its answer: a client may read its
                # answer a moment before the line is in the file.
                "--audit-log-mode=blocking",
                "--v=1",
                *self.apiserver_args,
            ],
            env=go_env(),
        )
        self.supervisor.wait_until(
            "kube-apiserver", lambda: self._get("/readyz") == b"ok", READY_TIMEOUT, "kube-apiserver"
        )

    def _start_controller_manager(self, ep: Endpoints) -> None:
        pki = self.pki
        config = write_kubeconfig(
            self.directory / "controller-manager.kubeconfig",
            kubeconfig(
                ep.server,
                pki / "ca.crt",
                {
                    "client-certificate": str(pki / "controller-manager.crt"),
                    "client-key": str(pki / "controller-manager.key"),
                },
            ),
        )
        self.supervisor.start(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                # Each controller acts as its own ServiceAccount in kube-system, as kubeadm runs it: the
                # garbage collector's deletes are then judged by RBAC like any other client's.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--v=1",
            ],
            env=go_env(),
        )
        self.supervisor.wait_until(
            "kube-controller-manager",
            lambda: b"kube-system" in self._get("/api/v1/namespaces/kube-system/serviceaccounts/default"),
            READY_TIMEOUT,
            "kube-controller-manager (kube-system's default ServiceAccount)",
        )

    # ------------------------------------------------------------------ admin requests (no client library)

    def _ssl(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=5) as response:
            return response.read()


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200
