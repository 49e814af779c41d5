"""The backends' real upstream controllers — JobSet, Kueue, the Kubeflow Trainer and the training-operator — run out
of cluster as processes beside the control plane, with their webhooks serving, as controller-runtime's envtest runs
a controller under test:

- installed from their own module trees (atlas_cluster/versions.py: CONTROLLERS), as their kustomize trees would
  install them: the RBAC files in the tree's namespace with its name prefix, the webhook configurations with the
  patches and replacements of the kustomization beside them, and each webhook's ``clientConfig.service`` replaced
  by ``clientConfig.url: https://127.0.0.1:<port>/<path>`` with ``caBundle`` the CA that signed the serving cert;
- each under its own ServiceAccount with its upstream ClusterRole (a TokenRequest token in a kubeconfig, as the
  operator is run), never as the admin;
- leader election off, metrics, health and webhook ports of its own on 127.0.0.1, a serving certificate for
  127.0.0.1 in a folder of its own, and its built-in certificate rotation (which expects an in-cluster Service and
  Secret) turned off — or, where it cannot be (the training-operator), given certificates it accepts as its own;
- ready when its readiness endpoint answers 200 and its webhook server answers over TLS with that certificate.

Each is an ``UpstreamController`` (atlas_cluster/component.py's supervised process), one class per upstream.
``start_controllers(cluster, names)`` starts them on a running LocalCluster (after its control plane);
``stop_controllers`` stops them and removes their webhook configurations, so the cluster works on without them.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from atlas_cluster import versions
from atlas_cluster.api import Api
from atlas_cluster.build import controller_binary, module_dir
from atlas_cluster.component import GO_GC_PERCENT, Component
from atlas_cluster.controlplane import ControlPlane
from atlas_cluster.pki import make_ca, sign_serving_cert
from atlas_cluster.ports import free_port
from atlas_cluster.processes import Supervisor

READY_TIMEOUT = 120.0
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "Namespace",
    "ValidatingWebhookConfiguration",
}
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# Kueue's jobs integrations that matter here (its default list adds Ray, MPI, AppWrapper, pods, Deployments...,
# whose webhooks then answer as no-ops): batch Jobs and the three kinds the operator makes.
KUEUE_FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob")
# Kueue with internalCertManagement off reads its metrics certificate from this fixed path (cmd/kueue/main.go),
# and exits when it is not there; no flag or field moves it.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# The training-operator's cert-controller rotator cannot be turned off (cmd/training-operator.v1 always starts it);
# it waits for this fixed folder's tls.crt (its in-cluster Secret mount) before it reports ready.
TRAINING_OPERATOR_ROTATOR_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


class ControllerError(RuntimeError):
    pass


class Cluster(Protocol):
    """What a controller needs of the running cluster (atlas_cluster/cluster.py ``LocalCluster``)."""

    directory: Path
    supervisor: Supervisor
    control_plane: ControlPlane

    @property
    def admin(self) -> Api: ...

    def apply_documents(self, docs: list[dict], path: Path) -> None: ...

    def service_account_kubeconfig(self, path: Path, namespace: str, service_account: str) -> Path: ...


# ---------------------------------------------------------------------- the module trees, as kustomize reads them


def expand(path: Path) -> list[Path]:
    """``path``, or for a kustomization (or a folder with one) its ``resources``, recursively."""
    if path.is_dir():
        path = path / "kustomization.yaml"
    if path.name != "kustomization.yaml":
        return [path]
    kustomization = yaml.safe_load(path.read_text()) or {}
    return [file for resource in kustomization.get("resources") or [] for file in expand(path.parent / resource)]


def load(paths: list[Path]) -> list[dict]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomize(docs: list[dict], namespace: str, prefix: str) -> list[dict]:
    """What a kustomization's ``namespace`` and ``namePrefix`` do to these objects and their references (each
    binding's role and ServiceAccount subjects name objects of the same tree)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        meta = doc["metadata"]
        meta["name"] = prefix + meta["name"]
        if doc["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = namespace
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            doc["roleRef"]["name"] = prefix + doc["roleRef"]["name"]
            for subject in doc.get("subjects") or []:
                if subject["kind"] == "ServiceAccount":
                    subject.update(name=prefix + subject["name"], namespace=namespace)
    return docs


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]


def json_patch(doc: dict, operations: list[dict]) -> None:
    """RFC 6902 ``add``/``replace``/``remove`` (what the trees' webhook patches use), in place."""
    for op in operations:
        *parents, last = _pointer(op["path"])
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] not in ("add", "replace", "remove"):
            raise ControllerError(f"JSON patch op {op['op']!r} is not supported")
        if isinstance(target, list):
            if op["op"] == "remove":
                del target[int(last)]
            elif last == "-":
                target.append(op["value"])
            elif op["op"] == "add":
                target.insert(int(last), op["value"])
            else:
                target[int(last)] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            target[last] = op["value"]


def _merge_webhooks(doc: dict, patch: dict) -> None:
    """A strategic-merge patch of a webhook configuration: its ``webhooks`` merged by name."""
    for webhook in patch.get("webhooks") or []:
        for existing in doc.get("webhooks") or []:
            if existing["name"] == webhook["name"]:
                existing.update(webhook)


def _matches(doc: dict, target: dict) -> bool:
    return all(
        doc["kind"] == v if k == "kind" else doc["metadata"]["name"] == v if k == "name" else True
        for k, v in target.items()
    )


def webhook_configurations(tree: Path, spec: versions.Controller) -> list[dict]:
    """The controller's webhook configurations as its webhook kustomization renders them (before the namespace,
    prefix and clientConfig): its manifests, then its patches (JSON patch files, or inline strategic-merge
    patches) and its ``webhooks.[name=X].FIELD`` replacements."""
    docs = load([tree / name for name in spec.webhooks])
    kustomization_file = (tree / spec.webhooks[0]).parent / "kustomization.yaml"
    kustomization = yaml.safe_load(kustomization_file.read_text()) if kustomization_file.exists() else {}
    for patch in kustomization.get("patches") or []:
        body = yaml.safe_load(
            (kustomization_file.parent / patch["path"]).read_text() if "path" in patch else patch["patch"]
        )
        for doc in docs:
            if isinstance(body, list):
                if _matches(doc, patch.get("target") or {}):
                    json_patch(doc, body)
            elif body.get("kind") == doc["kind"] and body["metadata"]["name"] == doc["metadata"]["name"]:
                _merge_webhooks(doc, body)
    for replacement in kustomization.get("replacements") or []:
        source = replacement["source"]
        field = re.fullmatch(r"webhooks\.\[name=([^\]]+)\]\.(\w+)", source["fieldPath"])
        assert field is not None, f"unsupported replacement source {source['fieldPath']}"
        origin = next(d for d in docs if d["kind"] == source["kind"] and d["metadata"]["name"] == source["name"])
        value = next(w for w in origin["webhooks"] if w["name"] == field.group(1))[field.group(2)]
        for target in replacement["targets"]:
            for doc in docs:
                if not _matches(doc, target["select"]):
                    continue
                for path in target["fieldPaths"]:
                    target_field = re.fullmatch(r"webhooks\.\[name=([^\]]+)\]\.(\w+)", path)
                    assert target_field is not None, f"unsupported replacement target {path}"
                    name, key = target_field.groups()
                    for webhook in doc["webhooks"]:
                        if webhook["name"] == name:
                            webhook[key] = copy.deepcopy(value)
    return docs


def served_at(docs: list[dict], port: int, ca_bundle: bytes) -> list[dict]:
    """Every webhook's ``clientConfig.service`` → ``url: https://127.0.0.1:<port><path>``, trusting ``ca_bundle``
    (controller-runtime's envtest does the same to point a cluster at a webhook server outside it)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        for webhook in doc.get("webhooks") or []:
            path = webhook["clientConfig"].get("service", {}).get("path", "/")
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
    return docs


# ---------------------------------------------------------------------- one controller


@dataclass
class Ports:
    metrics: int
    health: int
    webhook: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


@dataclass
class Running:
    """A started controller: where it listens, its folder, and its webhook configurations' names."""

    name: str
    ports: Ports
    directory: Path
    webhook_configurations: tuple[tuple[str, str], ...]  # (kind, name)


def controller_crd_files(names: tuple[str, ...]) -> list[Path]:
    """The CRDs only these controllers need (Kueue's), from their module trees."""
    files = []
    for name in names:
        spec = versions.CONTROLLERS[name]
        if spec.crds:
            tree = module_dir(spec.module, spec.version)
            files += [file for crd in spec.crds for file in expand(tree / crd)]
    return files


class UpstreamController(Component):
    """One upstream controller as a supervised process: its flags, environment and files — the parts that differ
    from one upstream to the next — and its readiness (its readyz, and its webhook server over TLS)."""

    ready_timeout = READY_TIMEOUT
    poll_s = 0.5  # each failed probe is a line of its log

    def __init__(self, cluster: Cluster, spec: versions.Controller, binary: Path):
        super().__init__(cluster.supervisor, binary)
        self.name = spec.name
        self.cluster = cluster
        self.spec = spec
        self.directory = cluster.directory / "controllers" / spec.name
        self.ports = Ports.pick()
        # controller-runtime's default webhook cert folder is $TMPDIR/k8s-webhook-server/serving-certs: each
        # controller gets a TMPDIR of its own, so that default is its own folder too.
        self.tmp = self.directory / "tmp"
        self.certs = self.tmp / "k8s-webhook-server" / "serving-certs"
        self.ca = cluster.control_plane.pki / "ca.crt"
        self.config_file = self.directory / "config.yaml"
        self.kubeconfig: Path | None = None  # its ServiceAccount's, set before it starts

    def host(self, port: int) -> str:
        return f"127.0.0.1:{port}"

    def write_config(self, config: dict) -> None:
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))

    def prepare(self) -> None:
        """Write the serving certificate (signed by the cluster's CA)."""
        sign_serving_cert(self.certs, self.ca)

    def flags(self) -> dict[str, str | None]:
        """A Configuration file (written by ``prepare``) and info logs."""
        return {"--config": str(self.config_file), "--zap-log-level": "info"}

    def extra_env(self) -> dict[str, str]:
        return {}

    def env(self) -> dict[str, str]:
        env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
        env.update(GOGC=GO_GC_PERCENT, KUBECONFIG=str(self.kubeconfig), TMPDIR=str(self.tmp), **self.extra_env())
        return env

    def cwd(self) -> Path:
        return self.directory

    def ready(self) -> bool:
        """Its readiness endpoint says 200, and its webhook server answers over TLS with a certificate the webhook
        configuration's CA verifies for 127.0.0.1 (any HTTP status: ``/`` is no webhook's path)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.health}/readyz", timeout=2) as response:
            if response.status != 200:
                return False
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{self.ports.webhook}/", context=context, timeout=2)
        except urllib.error.HTTPError:
            pass
        return True

    def not_ready(self) -> Exception:
        """The log's last lines that are not probes."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if "healthz" not in line]
        tail = "\n".join(lines[-25:])
        return ControllerError(
            f"{self.name}: not ready (readyz and its webhook) in {self.ready_timeout:.0f} s; {self.log}:\n{tail}"
        )


class JobSet(UpstreamController):
    """JobSet: its Configuration file; cert rotation off with ``internalCertManagement.enable: false``."""

    def prepare(self) -> None:
        super().prepare()
        self.write_config(
            {
                "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "health": {"healthProbeBindAddress": self.host(self.ports.health)},
                # Its metrics are served over TLS only; with internal cert management off it reads its cert here.
                "metrics": {"bindAddress": self.host(self.ports.metrics), "certDir": str(self.certs)},
                "webhook": {"port": self.ports.webhook, "host": "127.0.0.1", "certDir": str(self.certs)},
            }
        )


class Kueue(UpstreamController):
    """Kueue: its Configuration file; cert rotation off with ``internalCertManagement.enable: false``; the
    visibility API server (an aggregated API whose certificate folder is fixed at /visibility) off with the
    VisibilityOnDemand feature gate."""

    def prepare(self) -> None:
        super().prepare()
        if not (KUEUE_METRICS_CERTS / "tls.crt").exists() or not (KUEUE_METRICS_CERTS / "tls.key").exists():
            try:
                sign_serving_cert(KUEUE_METRICS_CERTS, self.ca)
            except OSError as exc:
                raise ControllerError(
                    f"kueue with internalCertManagement off reads its metrics certificate from the fixed folder "
                    f"{KUEUE_METRICS_CERTS}, which cannot be written here ({exc}): create it (tls.crt, tls.key)"
                ) from exc
        self.write_kueue_config()

    def write_kueue_config(self) -> None:
        self.write_config(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": self.spec.namespace,
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "health": {"healthProbeBindAddress": self.host(self.ports.health)},
                "metrics": {"bindAddress": self.host(self.ports.metrics)},
                "webhook": {"port": self.ports.webhook, "host": "127.0.0.1", "certDir": str(self.certs)},
                "featureGates": {"VisibilityOnDemand": False},
                "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
            }
        )


class Trainer(UpstreamController):
    """Kubeflow Trainer: its Configuration file; cert rotation off with ``certManagement.enable: false``; its
    webhook server has no cert-folder field and reads controller-runtime's default ($TMPDIR/k8s-webhook-server/...)."""

    def prepare(self) -> None:
        super().prepare()
        self.write_config(
            {
                "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "certManagement": {"enable": False},
                "health": {
                    "healthProbeBindAddress": self.host(self.ports.health),
                    "readinessEndpointName": "readyz",
                    "livenessEndpointName": "healthz",
                },
                "metrics": {"bindAddress": self.host(self.ports.metrics), "secureServing": False},
                "webhook": {"port": self.ports.webhook, "host": "127.0.0.1"},
            }
        )


class TrainingOperator(UpstreamController):
    """training-operator v1: flags only. Its cert-controller rotator always runs (no flag turns it off): it is
    handed a Secret it accepts as its own — a CA of its own name and a serving cert for its Service's DNS name and
    127.0.0.1 — so it rotates nothing and injects that CA, which the webhook configuration already trusts."""

    SECRET = "training-operator-webhook-cert"  # its --webhook-secret-name default
    SERVICE = "training-operator"  # its --webhook-service-name default
    CA_NAME = "training-operator-ca"  # pkg/cert: the rotator's CAName, which it verifies the CA against

    def prepare(self) -> None:
        ca = make_ca(self.directory / "ca", "ca", self.CA_NAME, self.CA_NAME, rsa=True)
        self.ca = ca
        dns = f"{self.SERVICE}.{self.spec.namespace}.svc"
        sign_serving_cert(self.certs, ca, (dns,))
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.SECRET, "namespace": self.spec.namespace},
            "data": {
                key: base64.b64encode(path.read_bytes()).decode()
                for key, path in {
                    "ca.crt": ca,
                    "ca.key": ca.with_suffix(".key"),
                    "tls.crt": self.certs / "tls.crt",
                    "tls.key": self.certs / "tls.key",
                }.items()
            },
        }
        self.cluster.apply_documents([secret], self.directory / "secret.yaml")
        # The rotator waits for its (hardcoded) mount folder's tls.crt; any certificate will do: its webhook server
        # reads the one in this controller's own TMPDIR.
        if not (TRAINING_OPERATOR_ROTATOR_DIR / "tls.crt").exists():
            TRAINING_OPERATOR_ROTATOR_DIR.mkdir(parents=True, exist_ok=True)
            (TRAINING_OPERATOR_ROTATOR_DIR / "tls.crt").write_bytes((self.certs / "tls.crt").read_bytes())

    def flags(self) -> dict[str, str | None]:
        """Flags only: it reads no Configuration file."""
        return {
            "--metrics-bind-address": self.host(self.ports.metrics),
            "--health-probe-bind-address": self.host(self.ports.health),
            "--leader-elect": "false",
            "--enable-scheme": "pytorchjob",
            "--webhook-server-port": str(self.ports.webhook),  # no host flag: it listens on every address
            "--webhook-service-name": self.SERVICE,
            "--webhook-secret-name": self.SECRET,
        }

    def extra_env(self) -> dict[str, str]:
        return {"MY_POD_NAMESPACE": self.spec.namespace}  # the rotator's Secret's namespace


CONTROLLERS: dict[str, type[UpstreamController]] = {
    "jobset": JobSet,
    "kueue": Kueue,
    "trainer": Trainer,
    "training-operator": TrainingOperator,
}


def start_controller(cluster: Cluster, name: str, binary: Path | None = None, log=print) -> Running:
    spec = versions.CONTROLLERS[name]
    binary = binary or controller_binary(name)
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"{binary} (build it: python -m atlas_cluster.build --controllers {name})")
    tree = module_dir(spec.module, spec.version)
    started = time.monotonic()
    launch = CONTROLLERS[name](cluster, spec, binary)
    launch.directory.mkdir(parents=True, exist_ok=True)
    launch.tmp.mkdir(parents=True, exist_ok=True)

    # Its namespace, RBAC and ServiceAccount, from its tree.
    rbac = kustomize(
        load([file for entry in spec.rbac for file in expand(tree / entry)]), spec.namespace, spec.name_prefix
    )
    accounts = [doc["metadata"]["name"] for doc in rbac if doc["kind"] == "ServiceAccount"]
    if len(accounts) != 1:
        raise ControllerError(f"{name}: expected one ServiceAccount in its RBAC files, found {accounts}")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace}}
    cluster.apply_documents([namespace, *rbac], launch.directory / "rbac.yaml")
    launch.kubeconfig = cluster.service_account_kubeconfig(launch.directory / "kubeconfig", spec.namespace, accounts[0])
    launch.start()

    # Its webhooks, pointed at it, once it answers (a webhook configuration failing closed before would refuse
    # every request it covers meanwhile).
    webhooks = kustomize(webhook_configurations(tree, spec), spec.namespace, spec.name_prefix)
    webhooks = served_at(webhooks, launch.ports.webhook, launch.ca.read_bytes())
    cluster.apply_documents(webhooks, launch.directory / "webhooks.yaml")
    identity = f"system:serviceaccount:{spec.namespace}:{accounts[0]}"
    took = time.monotonic() - started
    log(f"atlas cluster: {name} {spec.version} ready in {took:.1f} s as {identity} (port {launch.ports.webhook})")
    running = Running(
        name, launch.ports, launch.directory, tuple((doc["kind"], doc["metadata"]["name"]) for doc in webhooks)
    )
    (launch.directory / "running.json").write_text(
        json.dumps(
            {
                "ports": vars(launch.ports),
                "webhook_configurations": running.webhook_configurations,
            }
        )
    )
    return running


def start_controllers(
    cluster: Cluster, names: tuple[str, ...], binaries: dict[str, Path] | None = None, log=print
) -> dict[str, Running]:
    """Start each named controller on the running ``cluster`` (its control plane up, its CRDs and the
    controllers' CRDs applied: ``controller_crd_files``), each ready before the next."""
    running = {}
    for name in names:
        running[name] = start_controller(cluster, name, (binaries or {}).get(name), log)
    return running


def stop_controllers(cluster: Cluster, names: tuple[str, ...]) -> None:
    """Remove their webhook configurations (each fails closed: left behind, it would refuse what it covers) and
    stop their processes."""
    for name in names:
        record = cluster.directory / "controllers" / name / "running.json"
        if record.exists():
            for kind, config in json.loads(record.read_text())["webhook_configurations"]:
                # 404 (already gone) is fine, as kubectl's --ignore-not-found
                cluster.admin.call("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}s/{config}")
        cluster.supervisor.stop(name, grace=5.0)
