"""A local Kubernetes without Docker: the control plane (atlas_cluster/controlplane.py), the project's CRDs and chart
installed with the real ``helm``, the backends' CRDs from their upstream modules, and the operator started as a
process under its chart's ServiceAccount — never as admin, so every request it makes is judged by RBAC. Optionally
an S3-compatible server (atlas_cluster/s3.py) beside it, with its credentials in the Secret ``default/atlas-s3``, and
an MLflow tracking server (atlas_cluster/mlflow.py), its artifacts in that S3 server's bucket when both run.

This package imports neither half of the project: the chart and CRDs are files, the operator is ``atlas operator``
in a process, configured from the environment the chart's own Deployment gives it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from atlas_cluster import versions
from atlas_cluster.api import Api
from atlas_cluster.build import BuildError, go_binary, module_dir
from atlas_cluster.controllers import controller_crd_files, start_controllers
from atlas_cluster.controlplane import STOP_ORDER as CONTROL_PLANE_STOP_ORDER
from atlas_cluster.controlplane import ControlPlane, KubeScheduler
from atlas_cluster.helm_kubectl import ClusterError, helm, kubectl
from atlas_cluster.kubeconfig import kubeconfig, write_kubeconfig
from atlas_cluster.mlflow import PROCESS as MLFLOW
from atlas_cluster.mlflow import MLflowServer
from atlas_cluster.node.podnet import PodNetwork, with_cluster_names
from atlas_cluster.processes import Supervisor
from atlas_cluster.s3 import DEFAULT_BUCKET, S3Server
from atlas_cluster.s3 import PROCESS as S3

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "atlas-operator"
RELEASE = "atlas"
RELEASE_NAMESPACE = "atlas-system"
OPERATOR = "operator"
NODES = "nodes"
S3_SECRET = "atlas-s3"  # in S3_SECRET_NAMESPACE: AWS_ENDPOINT_URL (as the pods reach it), AWS_ACCESS_KEY_ID, …
S3_SECRET_NAMESPACE = "default"
MLFLOW_ARTIFACTS = f"s3://{DEFAULT_BUCKET}/mlflow"  # the MLflow server's artifacts when the S3 server runs too
# `down` stops what depends on the API server first (the nodes delete their Node objects and pods on the way out),
# the MLflow server once no pod uses it, the S3 server (where its artifacts go) after it, etcd last.
STOP_ORDER = (OPERATOR, *versions.CONTROLLERS, NODES, MLFLOW, S3, KubeScheduler.name, *CONTROL_PLANE_STOP_ORDER)
TOKEN_SECONDS = 7 * 24 * 3600  # the operator's token: a local cluster is not meant to live longer
# The environment the operator process keeps from ours (the rest comes from the chart's Deployment).
HOST_ENV = ("PATH", "HOME", "LANG", "TMPDIR", "PYTHONPATH", "ATLAS_CACHE_DIR", "VIRTUAL_ENV")


def atlas_command() -> list[str]:
    """``atlas`` of the Python running us (its venv's console script), else this Python with the CLI module."""
    atlas = Path(sys.executable).parent / "atlas"
    return [str(atlas)] if atlas.is_file() else [sys.executable, "-m", "atlas_cli.main"]


def backend_crd_files(log=print) -> list[Path]:
    """The backends' CRD files (atlas_cluster/versions.py) from their modules' own trees, fetched by
    ``go mod download`` into the Go module cache; [] with a line saying why when Go is not there."""
    try:
        go_binary()
    except BuildError as exc:
        log(f"atlas cluster: the backends' CRDs are not installed ({exc})")
        return []
    return [module_dir(c.module, c.version) / name for c in versions.BACKEND_CRDS for name in c.files]


@dataclass
class LocalCluster:
    """One named cluster in ``directory``. ``up()`` is kind's ``create cluster``; ``down()`` its ``delete``."""

    directory: Path
    bin_dir: Path
    chart_values: dict = field(default_factory=dict)
    operator_args: tuple[str, ...] = ()
    operator_env: dict[str, str] = field(default_factory=dict)
    install_backend_crds: bool = True
    start_operator: bool = True
    log: Callable[[str], object] = print
    # The backends' upstream controllers to run (atlas_cluster/controllers.py), started after the control plane
    # and before the chart; binaries from the cache unless given here (name → path).
    controllers: tuple[str, ...] = ()
    controller_binaries: dict[str, Path] = field(default_factory=dict)
    # Process nodes (atlas_cluster/node/) that run the pods the real kube-scheduler binds to them; 0: none, and
    # pods stay Pending. Each node offers gpus_per_node fake nvidia.com/gpu (scheduling only: pods run on CPU).
    nodes: int = 0
    gpus_per_node: int = 8
    apiserver_args: tuple[str, ...] = ()  # extra kube-apiserver flags (e.g. --watch-cache=false)
    # An S3-compatible server (atlas_cluster/s3.py, this binary) started after the nodes, its data in s3/data of the
    # cluster's folder, the bucket DEFAULT_BUCKET made, and its credentials in the Secret default/atlas-s3.
    s3_binary: Path | None = None
    # An MLflow tracking server (atlas_cluster/mlflow.py) started after the S3 server, its database in mlflow/ of the
    # cluster's folder, its artifacts there too, or in the S3 server's bucket (MLFLOW_ARTIFACTS) when one runs.
    mlflow: bool = False

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.directory)
        self.s3: S3Server | None = None
        self.mlflow_server: MLflowServer | None = None  # `mlflow` is the flag that asks for it
        self.control_plane = ControlPlane(self.directory, self.bin_dir, self.supervisor, self.apiserver_args)
        self._admin: Api | None = None

    @property
    def kubeconfig(self) -> Path:
        """The user's kubeconfig: the cluster's admin (as kind's)."""
        return self.control_plane.admin_kubeconfig

    @property
    def admin(self) -> Api:
        """The API as the cluster's admin (made once, after the control plane is up)."""
        if self._admin is None:
            self._admin = Api(self.kubeconfig)
        return self._admin

    @property
    def operator_kubeconfig(self) -> Path:
        return self.directory / "operator.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.supervisor.logs

    def up(self) -> LocalCluster:
        if self.supervisor.running():
            raise ClusterError(f"a cluster is already running in {self.directory} (atlas cluster down first)")
        started = time.monotonic()
        self.control_plane.start(controller_manager=False)
        # The CRDs before the controller manager, so its garbage collector knows their kinds from the start.
        crds = sorted((REPO / "crds").glob("*.yaml"))
        crds += backend_crd_files(self.log) if self.install_backend_crds else []
        self.apply_files(crds + controller_crd_files(self.controllers))
        self.control_plane.start_controller_manager()
        self.log(f"atlas cluster: control plane ready in {time.monotonic() - started:.1f} s")
        if self.controllers:
            start_controllers(self, self.controllers, self.controller_binaries, self.log)
        if self.nodes:
            self.start_nodes()
        if self.s3_binary:
            self.start_s3(self.s3_binary)
        if self.mlflow:
            self.start_mlflow()
        self.install_chart(self.chart_values)
        if self.start_operator:
            self.start_operator_process()
        return self

    def down(self) -> None:
        self.supervisor.stop_all(STOP_ORDER)

    def start_nodes(self) -> None:
        """The real kube-scheduler, then ``nodes`` process nodes in a process of their own (needs root: each pod
        gets network, mount and UTS namespaces); returns once every node is Ready."""
        binary = KubeScheduler.find(self.bin_dir)
        if binary is None:
            raise ClusterError(f"no kube-scheduler in {self.bin_dir} (make kube builds it)")
        KubeScheduler(self.directory, binary, self.supervisor).start()
        # Bridge and network namespace names: short (interface names are 15 characters), one set per cluster.
        prefix = "a" + hashlib.sha1(str(self.directory).encode()).hexdigest()[:6]
        self.supervisor.start(
            NODES,
            [sys.executable, "-m", "atlas_cluster.node", "--cluster-dir", str(self.directory),
             "--nodes", str(self.nodes), "--gpus", str(self.gpus_per_node), "--network-prefix", prefix],
            env=self.node_environment(),
        )  # fmt: skip  # a command line: each flag beside its value
        log = self.supervisor.log(NODES)
        self.supervisor.wait_until(NODES, lambda: "process nodes ready" in log.read_text(), 120, "process nodes")
        self.log(f"atlas cluster: {self.nodes} process node(s) ready, {self.gpus_per_node} fake GPUs each")

    def node_environment(self) -> dict[str, str]:
        """The process nodes' environment: this one, with the real CPU vLLM's launcher first on PATH when it is
        installed (``make vllm``), so the runs' rollout and student servers (``vllm serve <model>``) are the real
        vLLM on CPU. Asked of atlas_core's launcher as a program (this package imports neither half)."""
        env = dict(os.environ)
        folder = self.directory / "vllm-launcher"
        done = subprocess.run(
            [sys.executable, "-m", "atlas_core.vllm_cpu", "install-launcher", str(folder)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            env["PATH"] = os.pathsep.join((done.stdout.strip(), env.get("PATH", "/usr/bin:/bin")))
            self.log(f"atlas cluster: the nodes' vllm is the real CPU vLLM ({done.stdout.strip()}/vllm)")
        else:
            self.log(f"atlas cluster: no vllm on the nodes' PATH: {done.stderr.strip() or 'make vllm'}")
        return env

    def pod_gateway(self) -> str | None:
        """The host's address on the pods' bridge (what a pod's default route goes through), once process nodes
        run; None without them."""
        try:
            state = json.loads((self.directory / NODES / "network.json").read_text())  # ProcessNodes' workdir
        except (OSError, ValueError):
            return None
        return PodNetwork(self.directory / NODES, state["prefix"], state["cidr"]).gateway

    def start_s3(self, binary: Path, access_log: Path | None = None) -> S3Server:
        """The S3 server on 127.0.0.1 and, with process nodes, on the pods' gateway too (at one port), the bucket
        ``atlas``, and the Secret default/atlas-s3 with the address the pods reach. ``access_log``: the server's
        access log there (one line per request; bench/sources.py counts the GETs)."""
        gateway = self.pod_gateway()
        hosts = ("127.0.0.1", gateway) if gateway else ("127.0.0.1",)
        self.s3 = S3Server(self.directory / S3, binary, self.supervisor, hosts, access_log=access_log).start()
        self.s3.create_bucket(DEFAULT_BUCKET)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": S3_SECRET, "namespace": S3_SECRET_NAMESPACE},
            "type": "Opaque",
            "stringData": self.s3.env(hosts[-1]),
        }
        # From stdin: the secret is in no file and on no command line.
        kubectl(self.kubeconfig, "apply", "--server-side", "--force-conflicts", "--field-manager=atlas-cluster",
                "-f", "-", input=json.dumps(secret))  # fmt: skip  # a command line: each flag beside its value
        self.log(
            f"atlas cluster: S3 server on {', '.join(hosts)} port {self.s3.port} (bucket {DEFAULT_BUCKET}; "
            f"Secret {S3_SECRET_NAMESPACE}/{S3_SECRET})"
        )
        return self.s3

    def start_mlflow(self) -> MLflowServer:
        """The MLflow server on 127.0.0.1 and, with process nodes, on the pods' gateway too (at one port). When the
        cluster's S3 server runs (started by this object or recorded in the folder), its artifacts go to its bucket
        (MLFLOW_ARTIFACTS), the server holding the S3 credentials in its environment; else to a folder beside its
        database."""
        gateway = self.pod_gateway()
        hosts = ("127.0.0.1", gateway) if gateway else ("127.0.0.1",)
        s3 = self.s3
        if s3 is None and S3 in self.supervisor.running():
            s3 = S3Server.load(self.directory / S3, Path(), self.supervisor)
        artifacts, artifact_env = None, {}
        if s3 is not None:
            artifacts = MLFLOW_ARTIFACTS
            artifact_env = {**s3.env(), "AWS_DEFAULT_REGION": s3.region}  # as the host reaches it: 127.0.0.1
        started = time.monotonic()
        server = MLflowServer(
            self.directory / MLFLOW, self.supervisor, hosts, artifacts=artifacts, artifact_env=artifact_env
        ).start()
        self.mlflow_server = server
        self.log(
            f"atlas cluster: MLflow server on {', '.join(hosts)} port {server.port} in "
            f"{time.monotonic() - started:.1f} s (database {server.database}; artifacts "
            f"{server.artifacts_destination})"
        )
        return server

    # ------------------------------------------------------------------ installing

    def apply_files(self, files: list[Path]) -> None:
        if files:  # one kubectl for all: a process each cost a second apiece
            sources = [part for path in files for part in ("-f", str(path))]
            kubectl(self.kubeconfig, "apply", "--server-side", "--field-manager=atlas-cluster", *sources)
            self.wait_established()

    def apply_documents(self, docs: list[dict], path: Path) -> None:
        """Write ``docs`` to ``path`` (kept: what was applied) and apply them server-side as the admin."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        kubectl(self.kubeconfig, "apply", "--server-side", "--force-conflicts", "--field-manager=atlas-cluster",
                "-f", str(path))  # fmt: skip  # a command line: each flag beside its value

    def wait_established(self, timeout: float = 60.0) -> None:
        """Every CRD served (``Established``): the conditions appear a moment after the create."""
        deadline = time.monotonic() + timeout
        while True:
            crds = self.admin.ok("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
            waiting = [
                crd["metadata"]["name"]
                for crd in crds
                if not any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in crd.get("status", {}).get("conditions") or []
                )
            ]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"CRDs not Established in {timeout:.0f} s: {', '.join(waiting)}")
            time.sleep(0.2)

    def install_chart(self, values: dict, release: str = RELEASE, namespace: str = RELEASE_NAMESPACE) -> None:
        """``helm upgrade --install`` of the chart; the Deployment at 0 replicas, since the operator runs here as
        a process (a local cluster has no node to run its image)."""
        values_file = self.directory / f"values-{release}.yaml"
        values_file.write_text(yaml.safe_dump({"replicas": 0, **values}))
        # helm's --wait reads the Deployment's status, which only the controller manager writes (an envtest
        # --bin-dir may have none).
        wait = ["--wait", "--timeout", "2m"] if "kube-controller-manager" in self.control_plane.ready_after else []
        helm(
            self.kubeconfig,
            "upgrade", "--install", release, str(CHART), "--namespace", namespace, "--create-namespace",
            "--values", str(values_file), *wait,
        )  # fmt: skip  # a command line: each flag beside its value

    # ------------------------------------------------------------------ the operator, as its ServiceAccount

    def operator_deployment(self, release: str = RELEASE, namespace: str = RELEASE_NAMESPACE) -> dict:
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
        deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        found = self.admin.ok("GET", deployments, query={"labelSelector": selector})["items"]
        if len(found) != 1:
            raise ClusterError(f"expected one operator Deployment of release {release} in {namespace}: {len(found)}")
        return found[0]

    def service_account_kubeconfig(self, path: Path, namespace: str, service_account: str) -> Path:
        """A kubeconfig with a TokenRequest token of ``service_account``: what its pod would be given."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": TOKEN_SECONDS},
        }
        tokens = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        token = self.admin.ok("POST", tokens, request)["status"]["token"]
        config = kubeconfig(self.control_plane.server, self.control_plane.pki / "ca.crt", {"token": token})
        config["contexts"][0]["context"]["namespace"] = namespace
        return write_kubeconfig(path, config)

    def operator_environment(self, deployment: dict) -> tuple[list[str], dict[str, str]]:
        """The operator container's args and env as the chart renders them (a field reference resolved as the
        kubelet would), plus our kubeconfig; the caller's extra env last."""
        pod = deployment["spec"]["template"]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "operator")
        env = {name: os.environ[name] for name in HOST_ENV if name in os.environ}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[var["name"]] = deployment["metadata"]["namespace"]
            elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                # One pod's name, stable across restarts: a restarted operator is the same replica (its Lease).
                env[var["name"]] = f"{deployment['metadata']['name']}-local"
        env.update(KUBECONFIG=str(self.operator_kubeconfig), ATLAS_OPERATOR_METRICS_HOST="127.0.0.1")
        env.update(self.operator_env)
        return list(container.get("args", [])), env

    def operator_command(self, args: list[str]) -> list[str]:
        """``atlas <args>`` as the operator runs beside the cluster: resolving its Service names (the run's
        ``<name>-metrics``, which it scrapes) once process nodes run pods (atlas_cluster/node/podnet.py)."""
        return with_cluster_names(self.directory, [*atlas_command(), *args])

    def start_operator_process(self, release: str = RELEASE, namespace: str = RELEASE_NAMESPACE):
        deployment = self.operator_deployment(release, namespace)
        account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        self.service_account_kubeconfig(self.operator_kubeconfig, namespace, account)
        args, env = self.operator_environment(deployment)
        proc = self.supervisor.start(OPERATOR, self.operator_command([*args, *self.operator_args]), env=env)
        self.log(f"atlas cluster: operator started as system:serviceaccount:{namespace}:{account} (pid {proc.pid})")
        return proc

    def stop_operator(self) -> None:
        self.supervisor.stop(OPERATOR)
