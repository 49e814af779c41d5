"""etcd, kube-apiserver and kube-controller-manager as processes on 127.0.0.1 — controller-runtime's envtest
control plane, plus the controller manager (garbage collector, namespace, service-account and token controllers:
what a real cluster does to a run's children after the operator is gone) and the real kube-scheduler (for the
process nodes, atlas_cluster/node/). Each is a ``Component`` (atlas_cluster/component.py) with its flags as a map
that ``ControlPlane(flags={"kube-apiserver": {"--v": "4"}})`` overrides by name.

Authentication is by client certificate (the admin in ``system:masters``) and by service-account token
(TokenRequest, signed with the cluster's key); authorization is RBAC only, so what the operator may do is what its
chart grants, judged by the real authorizer.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from atlas_cluster.api import Api
from atlas_cluster.build import REQUIRED, missing
from atlas_cluster.component import Component, Flags
from atlas_cluster.kubeconfig import kubeconfig, user_kubeconfig, write_kubeconfig
from atlas_cluster.pki import make_pki
from atlas_cluster.ports import free_port
from atlas_cluster.processes import Supervisor

SERVICE_CIDR = "10.96.0.0/16"  # what kind and kubeadm use: room for every run's Services
ISSUER = "https://kubernetes.default.svc.cluster.local"
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
AUDIT_LOG = Path("logs") / "audit.log"  # in the cluster's folder
# Stopped in this order: what depends on the API server first, etcd last.
STOP_ORDER = ("kube-controller-manager", "kube-apiserver", "etcd")

__all__ = ["ControlPlane", "Endpoints", "Etcd", "KubeApiserver", "KubeControllerManager", "KubeScheduler", "free_port"]


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

    @property
    def etcd(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"


# ---------------------------------------------------------------------- the components


class Etcd(Component):
    """etcd on 127.0.0.1, its data in ``data_dir``; ready when ``/health`` answers 200."""

    name = "etcd"

    def __init__(
        self, supervisor: Supervisor, binary: Path, data_dir: Path, endpoints: Endpoints, overrides: Flags | None = None
    ):
        super().__init__(supervisor, binary, overrides)
        self.data_dir = data_dir
        self.endpoints = endpoints

    def flags(self) -> dict[str, str | None]:
        client, peer = self.endpoints.etcd, f"http://127.0.0.1:{self.endpoints.etcd_peer_port}"
        return {
            "--data-dir": str(self.data_dir),
            "--listen-client-urls": client,
            "--advertise-client-urls": client,
            "--listen-peer-urls": peer,
            "--initial-advertise-peer-urls": peer,
            "--initial-cluster": f"default={peer}",
            "--unsafe-no-fsync": None,  # a test cluster: losing it on a power cut is fine, waiting on fsync is not
            "--quota-backend-bytes": "4294967296",
            "--log-level": "warn",
        }

    def ready(self) -> bool:
        return _http_ok(f"{self.endpoints.etcd}/health")


class KubeApiserver(Component):
    """kube-apiserver on 127.0.0.1 over etcd: client-certificate and token authentication, RBAC, the audit log
    (AUDIT_POLICY); ready when ``/readyz`` says ok to the admin. ``extra_args`` come after its flags (the last one
    wins)."""

    name = "kube-apiserver"

    def __init__(
        self,
        supervisor: Supervisor,
        binary: Path,
        directory: Path,
        endpoints: Endpoints,
        overrides: Flags | None = None,
        extra_args: Sequence[str] = (),
    ):
        super().__init__(supervisor, binary, overrides, extra_args)
        self.directory = directory
        self.pki = directory / "pki"
        self.endpoints = endpoints

    @property
    def audit_policy(self) -> Path:
        return self.directory / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.directory / AUDIT_LOG

    def prepare(self) -> None:
        self.audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)

    def flags(self) -> dict[str, str | None]:
        pki = self.pki
        return {
            "--etcd-servers": self.endpoints.etcd,
            "--bind-address": "127.0.0.1",
            "--advertise-address": "127.0.0.1",
            "--secure-port": str(self.endpoints.api_port),
            "--tls-cert-file": str(pki / "apiserver.crt"),
            "--tls-private-key-file": str(pki / "apiserver.key"),
            "--client-ca-file": str(pki / "ca.crt"),
            "--authorization-mode": "RBAC",
            "--service-account-issuer": ISSUER,
            "--service-account-key-file": str(pki / "sa.pub"),
            "--service-account-signing-key-file": str(pki / "sa.key"),
            "--service-cluster-ip-range": SERVICE_CIDR,
            "--allow-privileged": "false",
            "--endpoint-reconciler-type": "none",  # its endpoint would be 127.0.0.1, which Endpoints refuse
            "--audit-policy-file": str(self.audit_policy),
            "--audit-log-path": str(self.audit_log),
            "--audit-log-format": "json",
            # Written by the request's own handler (not batched), just after its answer: a client may read its
            # answer a moment before the line is in the file.
            "--audit-log-mode": "blocking",
            "--v": "1",
        }

    def ready(self) -> bool:
        """``/readyz`` as the admin: a health endpoint, probed over plain HTTPS (no client library: before it is
        up, the library's retries would each log a warning)."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        with urllib.request.urlopen(self.endpoints.server + "/readyz", context=context, timeout=5) as response:
            return response.read() == b"ok"


class KubeControllerManager(Component):
    """kube-controller-manager as its own user (``controller-manager.kubeconfig``), each controller as its own
    ServiceAccount; ready once its service-account controller has made kube-system's default ServiceAccount."""

    name = "kube-controller-manager"
    what = "kube-controller-manager (kube-system's default ServiceAccount)"

    def __init__(
        self,
        supervisor: Supervisor,
        binary: Path,
        directory: Path,
        endpoints: Endpoints,
        overrides: Flags | None = None,
    ):
        super().__init__(supervisor, binary, overrides)
        self.directory = directory
        self.pki = directory / "pki"
        self.endpoints = endpoints
        self.config = directory / "controller-manager.kubeconfig"
        self.port = free_port()

    def prepare(self) -> None:
        pki = self.pki
        user = {
            "client-certificate": str(pki / "controller-manager.crt"),
            "client-key": str(pki / "controller-manager.key"),
        }
        write_kubeconfig(self.config, kubeconfig(self.endpoints.server, pki / "ca.crt", user))
        self.admin = Api(self.directory / "admin.kubeconfig")

    def flags(self) -> dict[str, str | None]:
        pki, config = self.pki, str(self.config)
        return {
            "--kubeconfig": config,
            "--authentication-kubeconfig": config,
            "--authorization-kubeconfig": config,
            "--leader-elect": "false",
            "--bind-address": "127.0.0.1",
            "--secure-port": str(self.port),
            # Each controller acts as its own ServiceAccount in kube-system, as kubeadm runs it: the
            # garbage collector's deletes are then judged by RBAC like any other client's.
            "--use-service-account-credentials": "true",
            "--service-account-private-key-file": str(pki / "sa.key"),
            "--root-ca-file": str(pki / "ca.crt"),
            "--service-cluster-ip-range": SERVICE_CIDR,
            "--cluster-signing-cert-file": str(pki / "ca.crt"),
            "--cluster-signing-key-file": str(pki / "ca.key"),
            "--v": "1",
        }

    def ready(self) -> bool:
        status, _ = self.admin.call("GET", "/api/v1/namespaces/kube-system/serviceaccounts/default")
        return status == 200


class KubeScheduler(Component):
    """The real kube-scheduler as user ``system:kube-scheduler`` (whose bootstrap RBAC exists), leader election
    off; ready when its ``/readyz`` answers 200."""

    name = "kube-scheduler"

    def __init__(
        self, cluster_dir: Path, binary: Path, supervisor: Supervisor | None = None, overrides: Flags | None = None
    ):
        super().__init__(supervisor or Supervisor(cluster_dir), binary, overrides)
        self.cluster_dir = cluster_dir
        self.settings = cluster_dir / "scheduler-config.yaml"
        self.config = cluster_dir / "scheduler.kubeconfig"
        self.port = 0

    @staticmethod
    def find(bin_dir: Path | None = None) -> Path | None:
        """``kube-scheduler`` in ``bin_dir``, else ``$ATLAS_KUBE_SCHEDULER``; None when neither is there."""
        for candidate in (bin_dir / "kube-scheduler" if bin_dir else None, os.environ.get("ATLAS_KUBE_SCHEDULER")):
            if candidate and os.access(candidate, os.X_OK):
                return Path(candidate)
        return None

    def prepare(self) -> None:
        self.config = user_kubeconfig(self.cluster_dir, "scheduler", "/CN=system:kube-scheduler")
        self.settings.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.config)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self.port = free_port()

    def flags(self) -> dict[str, str | None]:
        return {
            "--config": str(self.settings),
            "--authentication-kubeconfig": str(self.config),
            "--authorization-kubeconfig": str(self.config),
            "--bind-address": "127.0.0.1",
            "--secure-port": str(self.port),
            "--v": "1",
        }

    def ready(self) -> bool:
        context = ssl._create_unverified_context()  # its serving certificate is self-signed
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=2)
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200


# ---------------------------------------------------------------------- the control plane


class ControlPlane:
    """One control plane in ``directory`` (``pki/``, ``etcd/``, ``logs/``, ``admin.kubeconfig``). ``flags``: per
    component name, flags that replace (or add to) its own by name; ``apiserver_args``: extra kube-apiserver flags,
    after its own (the last one wins)."""

    def __init__(
        self,
        directory: Path,
        bin_dir: Path,
        supervisor: Supervisor | None = None,
        apiserver_args: Sequence[str] = (),
        flags: Mapping[str, Flags] | None = None,
    ):
        self.directory = directory
        self.bin_dir = bin_dir
        self.supervisor = supervisor or Supervisor(directory)
        self.apiserver_args = tuple(apiserver_args)
        self.flags = {name: dict(overrides) for name, overrides in (flags or {}).items()}
        self.pki = directory / "pki"
        self.endpoints: Endpoints | None = None
        self.ready_after: dict[str, float] = {}  # process → seconds from its start to ready

    @property
    def admin_kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one per request of a ServiceAccount outside kube-system (AUDIT_POLICY)."""
        return self.directory / AUDIT_LOG

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
        self._timed(
            Etcd(self.supervisor, self.bin_dir / "etcd", self.directory / "etcd", endpoints, self.flags.get(Etcd.name))
        )
        self._timed(self._apiserver())
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
            assert self.endpoints is not None, "not started"
            self._timed(
                KubeControllerManager(
                    self.supervisor,
                    self.bin_dir / "kube-controller-manager",
                    self.directory,
                    self.endpoints,
                    self.flags.get(KubeControllerManager.name),
                )
            )

    def _apiserver(self) -> KubeApiserver:
        assert self.endpoints is not None, "not started"
        return KubeApiserver(
            self.supervisor,
            self.bin_dir / "kube-apiserver",
            self.directory,
            self.endpoints,
            self.flags.get(KubeApiserver.name),
            self.apiserver_args,
        )

    def _timed(self, component: Component) -> None:
        started = time.monotonic()
        component.start()
        self.ready_after[component.name] = time.monotonic() - started

    def stop(self) -> None:
        self.supervisor.stop_all(STOP_ORDER)

    # ------------------------------------------------------------------ faults

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver, as a crash: every client's connection reset, no graceful shutdown."""
        self.supervisor.kill(KubeApiserver.name)

    def start_apiserver(self, apiserver_args: Sequence[str] | None = None) -> None:
        """kube-apiserver (again, after ``kill_apiserver``) on the same ports, certificates, etcd and audit log;
        ``apiserver_args`` replaces the extra flags when given. Returns once it is ready."""
        if apiserver_args is not None:
            self.apiserver_args = tuple(apiserver_args)
        self._timed(self._apiserver())

    def etcd(self, path: str, body: dict) -> dict:
        """One call to etcd's JSON gateway (``/v3/kv/range``, ``/v3/kv/compaction``…): keys are base64."""
        assert self.endpoints is not None, "not started"
        request = urllib.request.Request(f"{self.endpoints.etcd}{path}", data=json.dumps(body).encode(), method="POST")
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


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200
