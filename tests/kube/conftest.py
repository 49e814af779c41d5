"""The real-Kubernetes tier: one control plane for the tier (etcd, kube-apiserver, kube-controller-manager built
from the upstream modules: atlas_cluster), each test in its own namespace, as controller-runtime's envtest.

- ``kube``: the tier's cluster (admin kubeconfig, a kubernetes client, ``kubectl``); the project's CRDs and the
  backends' CRDs (from their modules, atlas_cluster/versions.py) are installed; no chart, no operator.
- ``namespace``: a fresh namespace for the test, deleted after it.
- ``operator_release``: ``install(values) -> Release``: the chart installed with the real helm under a release of
  the test's own, and ``atlas operator`` started under that release's ServiceAccount token — never as admin.

Without Go and without binaries (a laptop), the tier skips with one line saying what to install; with
``ATLAS_REQUIRE_KUBE=1`` (set by .ci/run) it fails instead. On a failure, the end of the operator's and the API
server's logs is printed with the report.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import pytest

from atlas_cluster.build import (
    REQUIRED,
    BuildError,
    controller_binary,
    default_bin_dir,
    ensure_built,
    ensure_controllers,
    missing,
)
from atlas_cluster.cluster import LocalCluster, backend_crd_files, helm, kubectl
from atlas_cluster.controllers import Running, controller_crd_files, start_controllers, stop_controllers
from atlas_cluster.controlplane import KubeScheduler
from atlas_cluster.node import ProcessNodes, podnet
from atlas_cluster.processes import log_tail
from harness.env import REPO, free_port
from harness.polling import wait_for

# Read before any fixture moves ATLAS_CACHE_DIR to a temporary folder (tests/conftest.py's atlas_cache).
BIN_DIR = Path(os.environ.get("ATLAS_KUBE_BIN") or default_bin_dir())
REQUIRE = os.environ.get("ATLAS_REQUIRE_KUBE") == "1"
CONTROLLERS = ("jobset", "kueue", "trainer", "training-operator")
CONTROLLER_BINARIES = {name: controller_binary(name) for name in CONTROLLERS}  # read at import, as BIN_DIR
_counter = itertools.count()


def _unavailable(reason: str):
    message = f"real Kubernetes tier: {reason}"
    if REQUIRE:
        pytest.fail(message + " (ATLAS_REQUIRE_KUBE=1)", pytrace=False)
    pytest.skip(message)


@dataclass
class Kube:
    cluster: LocalCluster

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return kubectl(self.kubeconfig, *args, input=input, check=check)

    def api(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        """A kubernetes client as the admin (or as the user of ``kubeconfig``)."""
        return kubernetes.config.new_client_from_config(str(kubeconfig or self.kubeconfig))

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


# Package scope: one control plane for the whole tier, stopped when its last test ends (a session scope kept it,
# idle but not free, beside every later test of the suite).
@pytest.fixture(scope="package")
def kube(tmp_path_factory) -> Iterator[Kube]:
    if missing(BIN_DIR, REQUIRED):
        try:
            ensure_built(BIN_DIR)
        except BuildError as exc:
            _unavailable(f"{exc} (or make kube)")
    directory = tmp_path_factory.mktemp("kube")
    cluster = LocalCluster(directory, BIN_DIR, start_operator=False, log=lambda line: None)
    try:
        cluster.control_plane.start(controller_manager=False)
        # The CRDs first: the garbage collector then knows their kinds from its start (else only 30 s later).
        cluster.apply_files(sorted((REPO / "crds").glob("*.yaml")) + _backend_crds())
        cluster.control_plane.start_controller_manager()
        yield Kube(cluster)
    finally:
        cluster.down()


def _backend_crds() -> list[Path]:
    files = backend_crd_files(log=lambda line: None)
    if not files:
        _unavailable("the backends' CRDs need `go` (go mod download)")
    return files


@contextlib.contextmanager
def upstream_controllers(kube: Kube, names: tuple[str, ...] = CONTROLLERS) -> Iterator[dict[str, Running]]:
    """The backends' real controllers (atlas_cluster/controllers.py) on the tier's cluster, built if need be, their
    CRDs installed; stopped after, with their webhook configurations removed (the cluster's other tests expect
    backends nobody reconciles)."""
    for name in names:
        if not os.access(CONTROLLER_BINARIES[name], os.X_OK):
            try:
                ensure_controllers((name,), CONTROLLER_BINARIES[name].parent, log=lambda line: None)
            except BuildError as exc:
                _unavailable(f"{exc} (or make kube-controllers)")
    cluster = kube.cluster
    cluster.apply_files(controller_crd_files(names))
    try:
        yield start_controllers(cluster, names, CONTROLLER_BINARIES, log=lambda line: None)
    finally:
        stop_controllers(cluster, names)


@contextlib.contextmanager
def process_nodes(kube: Kube, **options) -> Iterator[ProcessNodes]:
    """The real kube-scheduler and process nodes (atlas_cluster/node/: ``ProcessNodes(**options)``) that run the
    pods it binds; stopped after."""
    binary = KubeScheduler.find(BIN_DIR)
    if binary is None:  # atlas_cluster/build.py builds it with the control plane (make kube)
        _unavailable(f"no kube-scheduler in {BIN_DIR} nor $ATLAS_KUBE_SCHEDULER")
    reason = podnet.available()
    if reason:
        _unavailable(f"process nodes: {reason}")
    cluster = kube.cluster
    scheduler = KubeScheduler(cluster.directory, binary, cluster.supervisor).start()
    nodes = ProcessNodes(cluster.directory, network_prefix=f"t{os.getpid()}", **options)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
        scheduler.stop()


def eventually(what: str, probe: Callable[[], object], timeout: float = 60.0, every: float = 0.3):
    """``probe()``'s first truthy value, polled every ``every`` s; fails naming ``what`` after ``timeout`` s: the
    harness's ``wait_for`` at the tier's pace, ``what`` first."""
    return wait_for(probe, timeout, every, what)


def _dns_name(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")


@pytest.fixture
def namespace(kube: Kube, request) -> Iterator[str]:
    # Short: the chart names objects <release>-metrics and the like after it, within 63 characters.
    name = f"t{next(_counter)}-{_dns_name(request.node.name.removeprefix('test_'))}"[:30].rstrip("-")
    kube.kubectl("create", "namespace", name)
    # The controller manager's serviceaccount controller adds `default` a moment later; until then a ReplicaSet's
    # pods are refused (FailedCreate) — a state no user's namespace is in by the time they apply a run.
    eventually(
        f"namespace {name}'s default ServiceAccount",
        lambda: kube.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@dataclass
class Release:
    """A chart release and the operator process running under its ServiceAccount."""

    name: str
    namespace: str
    kube: Kube

    @property
    def operator_log(self) -> Path:
        return self.kube.cluster.supervisor.log(f"operator-{self.name}")

    def operator_api(self) -> kubernetes.client.ApiClient:
        """A client with the operator's own credentials (its ServiceAccount's token)."""
        return self.kube.api(self.kube.cluster.directory / f"operator-{self.name}.kubeconfig")


def install_release(kube: Kube, namespace: str, values: dict | None = None) -> Release:
    """The chart as release ``namespace`` in ``namespace``, with cluster-scoped names of its own (RBAC, the
    ClusterTrainingRuntime): releases of several tests coexist."""
    own = {"fullnameOverride": f"atlas-{namespace}", "trainJob": {"runtime": {"name": f"atlas-grpo-{namespace}"}}}
    kube.cluster.install_chart({**own, **(values or {})}, namespace, namespace)
    return Release(namespace, namespace, kube)


def start_release(kube: Kube, namespace: str, values: dict | None = None, env: dict[str, str] | None = None) -> Release:
    """``install_release``, then ``atlas operator`` under that release's ServiceAccount token with the env its
    Deployment renders, plus fast timers."""
    release = install_release(kube, namespace, values)
    start_operator(kube, release, f"operator-{release.name}", env)
    return release


def start_operator(kube: Kube, release: Release, process: str, env: dict[str, str] | None = None):
    """One operator process ``process`` of ``release`` (a replica: give each its own ``POD_NAME`` in ``env``)."""
    cluster = kube.cluster
    deployment = cluster.operator_deployment(release.name, release.namespace)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    config = cluster.service_account_kubeconfig(
        cluster.directory / f"operator-{release.name}.kubeconfig", release.namespace, account
    )
    args, environment = cluster.operator_environment(deployment)
    environment.update(
        KUBECONFIG=str(config),
        ATLAS_OPERATOR_METRICS_PORT=str(free_port()),
        ATLAS_RETRY_DELAY="0.5",
        ATLAS_PROGRESS_INTERVAL="1",
        ATLAS_LOG_FORMAT="plain",
    )
    environment.update(env or {})  # the test's own last: it may set other timers
    command = cluster.operator_command([*args, "--verbose"])  # resolving the run's Services when nodes run pods
    return cluster.supervisor.start(process, command, env=environment)


def stop_release(kube: Kube, release: Release) -> None:
    kube.cluster.supervisor.stop(f"operator-{release.name}", grace=1.0)  # kopf's graceful stop takes ~5 s
    helm(kube.kubeconfig, "uninstall", release.name, "-n", release.namespace, "--wait=false", check=False)


@pytest.fixture
def operator_release(kube: Kube, namespace: str):
    """``install(values=None, env=None, start=True) -> Release``: the chart as release ``<namespace>`` in
    ``namespace``, and its operator started (``start_release``); both removed after."""
    started: list[Release] = []

    def install(values: dict | None = None, env: dict[str, str] | None = None, start: bool = True) -> Release:
        release = start_release(kube, namespace, values, env) if start else install_release(kube, namespace, values)
        started.append(release)
        return release

    yield install
    for release in started:
        stop_release(kube, release)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "kube" not in item.fixturenames:
        return
    kube = item.funcargs.get("kube")
    if not isinstance(kube, Kube):
        return
    for path in sorted(kube.cluster.logs.glob("operator-*.log")) + [kube.cluster.logs / "kube-apiserver.log"]:
        report.sections.append((f"log {path.name} (last lines)", log_tail(path, 60)))
