"""Helpers shared by the operator tests: run manifests and the third-party schemas they must satisfy."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from atlas_contract.names import ChildNames
from tests.support import label_selectors
from tests.support.env import free_port, python_env
from tests.support.kube_emulator import PYTORCHJOBS, TEACHERS, TRAININGS, EmulatorThread, wait_for, write_kubeconfig

GROUP, VERSION = "atlas.arc.computer", "v1alpha1"
NS = "team-a"
NETWORK_POLICIES = "networking.k8s.io/v1/networkpolicies"
TIMEOUT = 30


def _schemas_dir() -> Path | None:
    """The third-party schemas beside the checkout (../shared/k8s-schemas), or $ATLAS_K8S_SCHEMAS.
    They are test data we may not copy into the repository."""
    import os

    candidates = [
        os.environ.get("ATLAS_K8S_SCHEMAS"),
        Path(__file__).resolve().parents[3] / "shared" / "k8s-schemas",
    ]
    return next((Path(c) for c in candidates if c and (Path(c) / PYTORCHJOB_CRD_NAME).is_file()), None)


PYTORCHJOB_CRD_NAME = "kubeflow.org_pytorchjobs.v1.9.0.yaml"
KUBE_VERSION = "1.37.0"


def training(name: str = "grpo-run", **spec: Any) -> dict[str, Any]:
    base = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset": {"source": "builtin://arithmetic"},
        "training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 10},
        "resources": {"nodes": 2, "gpusPerNode": 8},
        "rollout": {"replicas": 1, "gpus": 2, "tensorParallelSize": 2},
    }
    base.update(spec)
    return {
        "apiVersion": "atlas.arc.computer/v1alpha1",
        "kind": "AtlasTraining",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": base,
    }


def tiny_training(name: str, **spec: Any) -> dict[str, Any]:
    """An AtlasTraining that really trains here: the tiny model on CPU, one node, no servers, a few steps."""
    manifest = training(
        name,
        model="builtin://tiny-llama",
        resources={"nodes": 1, "gpusPerNode": 0},
        rollout={"replicas": 0},
        deepspeed="zero1",
        training={
            "maxSteps": 6,
            "perDeviceTrainBatchSize": 4,
            "numGenerations": 4,
            "maxCompletionLength": 16,
            "learningRate": 3e-4,
            "loggingSteps": 1,
            "gradientCheckpointing": False,
        },
        checkpoint={"path": "/checkpoints", "saveSteps": 3},
    )
    manifest["spec"].update(spec)
    return manifest


def teacher(name: str = "teacher-run", **spec: Any) -> dict[str, Any]:
    manifest = training(name, **spec)
    manifest["kind"] = "AtlasTeacher"
    manifest["spec"].setdefault(
        "student", {"model": "meta-llama/Llama-3.2-1B-Instruct", "rollout": {"replicas": 1, "gpus": 1}}
    )
    return manifest


def with_spec(manifest: dict[str, Any], **changes: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    manifest["spec"].update(changes)
    return manifest


def _jsonschema_of(schema: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour) → JSON Schema: int-or-string and nullable made explicit."""
    if isinstance(schema, list):
        return [_jsonschema_of(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _jsonschema_of(v) for k, v in schema.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **{k: v for k, v in out.items() if k != "anyOf"}}
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def openapi_validate(document: Any, schema: dict[str, Any]) -> None:
    """Validate with JSON Schema draft 4: OpenAPI v3.0's dialect (boolean exclusiveMinimum)."""
    import jsonschema

    jsonschema.Draft4Validator(schema).validate(document)


def pruned_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would drop from ``value`` (structural-schema pruning): every key must be
    declared, unless its object preserves unknown fields."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += pruned_fields(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list) and "items" in schema:
        return [p for i, item in enumerate(value) for p in pruned_fields(item, schema["items"], f"{path}[{i}]")]
    return []


def crd_jsonschema(crd: dict[str, Any]) -> dict[str, Any]:
    return _jsonschema_of(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def _skip_without(crd_name: str, still_ran: str) -> None:
    """Skip the test, naming the third-party CRD that is not here and the checks that ran without it."""
    import pytest

    pytest.skip(
        f"{crd_name} not found beside the checkout (../shared/k8s-schemas) nor in $ATLAS_K8S_SCHEMAS; "
        f"{still_ran} still ran"
    )


def pytorchjob_schema() -> dict[str, Any]:

    schemas = _schemas_dir()
    if schemas is None:
        _skip_without(PYTORCHJOB_CRD_NAME, "the webhook rules and kubernetes-validate checks")
    return crd_jsonschema(yaml.safe_load((schemas / PYTORCHJOB_CRD_NAME).read_text()))


def pytorchjob_webhook_problems(job: dict[str, Any]) -> list[str]:
    """The Training Operator's admission webhook rules for PyTorchJob."""
    problems = []
    replicas = job["spec"]["pytorchReplicaSpecs"]
    for replica_type, replica in replicas.items():
        if replica_type not in ("Master", "Worker"):
            problems.append(f"replica type {replica_type}")
        containers = replica["template"]["spec"]["containers"]
        pytorch = [c for c in containers if c.get("name") == "pytorch"]
        if not pytorch or not pytorch[0].get("image"):
            problems.append(f"{replica_type}: no container 'pytorch' with an image")
    if "Master" in replicas and replicas["Master"].get("replicas") != 1:
        problems.append("Master replicas != 1")
    return problems


JOBSET_CRD_NAME = "jobset.x-k8s.io_jobsets.v0.12.0.yaml"


@functools.cache
def _jobset_crd() -> dict[str, Any] | None:
    """The JobSet v0.12.0 CRD beside the checkout (or in $ATLAS_K8S_SCHEMAS), read once: it is 800 kB."""
    schemas = _schemas_dir()
    if schemas is None or not (schemas / JOBSET_CRD_NAME).is_file():
        return None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((schemas / JOBSET_CRD_NAME).read_text(), Loader=loader)


def jobset_openapi_schema() -> dict[str, Any]:
    """The JobSet CRD's structural schema as the API server holds it (for :func:`pruned_fields`)."""

    crd = _jobset_crd()
    if crd is None:
        _skip_without(JOBSET_CRD_NAME, "the webhook rules")
    return copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def jobset_schema() -> dict[str, Any]:
    """The JobSet v0.12.0 CRD's schema as JSON Schema (for :func:`openapi_validate`), like
    :func:`pytorchjob_schema`: third-party test data, never copied into the repository."""
    crd = _jobset_crd()
    if crd is None:
        _skip_without(JOBSET_CRD_NAME, "the webhook rules")
    return crd_jsonschema(crd)


_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_FAILURE_RULE_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
# pkg/webhooks/jobset_webhook.go validOnJobFailureReasons (v0.12.0).
JOBSET_JOB_FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
)
_MAX_INT32 = 2**31 - 1


def _dns1035_problems(value: str, what: str) -> list[str]:
    """k8s.io/apimachinery IsDNS1035Label: at most 63 characters; lowercase alphanumerics and '-', starting
    with a letter, ending with an alphanumeric."""
    problems = []
    if len(value) > 63:
        problems.append(f"{what} {value!r}: {len(value)} characters, must be no more than 63")
    if not _DNS_1035_LABEL.fullmatch(value):
        problems.append(f"{what} {value!r}: not a DNS-1035 label (lowercase alphanumerics and '-', a letter first)")
    return problems


def _dns1123_subdomain_problems(value: str, what: str) -> list[str]:
    if len(value) > 253 or not all(_DNS_1123_LABEL.fullmatch(part) for part in value.split(".")):
        return [f"{what} {value!r}: not a DNS-1123 subdomain"]
    return []


def jobset_webhook_problems(js: dict[str, Any]) -> list[str]:
    """What the JobSet v0.12.0 admission webhooks (pkg/webhooks/jobset_webhook.go: ``Default``, then
    ``ValidateCreate``) and its CEL rules would refuse on create, with the feature gates at their defaults
    (InPlaceRestart and RestartJob off); [] when the JobSet is admitted. Two checks go past the webhook, as
    the child Jobs need them: ``restartPolicy`` must be set (the webhook defaults it to OnFailure, restarts in
    place the JobSet never sees, and podFailurePolicy needs Never), and an Indexed Job needs ``completions``.
    A self-dependency (which the webhook lets through, and which never starts) is refused too.
    coordinator, managedBy and volumeClaimPolicies are not modelled: a JobSet that sets them is reported."""
    problems: list[str] = []
    spec = js.get("spec") or {}
    name = (js.get("metadata") or {}).get("name") or ""
    problems += _dns1035_problems(name, "metadata.name (also the headless Service's name)")
    for unmodelled in ("coordinator", "managedBy", "volumeClaimPolicies"):
        if unmodelled in spec:
            problems.append(f"spec.{unmodelled}: not modelled by this stand-in of the webhook")
    failure_policy = spec.get("failurePolicy")
    if failure_policy is not None and failure_policy.get("restartStrategy") == "InPlaceRestart":
        problems.append("spec.failurePolicy.restartStrategy: InPlaceRestart needs the InPlaceRestart feature gate")
    rjobs = spec.get("replicatedJobs") or []
    if not rjobs:
        problems.append("spec.replicatedJobs: no replicated job")
    if rjobs and rjobs[0].get("dependsOn") is not None:
        problems.append("DependsOn can't be set for the first ReplicatedJob")
    subdomain = (spec.get("network") or {}).get("subdomain")
    if subdomain:
        problems += _dns1123_subdomain_problems(subdomain, "spec.network.subdomain")
        problems += _dns1035_problems(subdomain, "spec.network.subdomain")
    startup = (spec.get("startupPolicy") or {}).get("startupPolicyOrder")
    if startup == "InOrder" and any("dependsOn" in rjob for rjob in rjobs):  # a CEL rule of the CRD
        problems.append("spec: startupPolicy InOrder and dependsOn are mutually exclusive")
    names: set[str] = set()
    for index, rjob in enumerate(rjobs):
        where = f"spec.replicatedJobs[{index}]"
        rname = rjob.get("name") or ""
        if rname in names:
            problems.append(f"{where}.name: {rname!r} appears twice (the list's map key)")
        names.add(rname)
        replicas = rjob.get("replicas", 1)  # CRD default
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        parallelism = job_spec.get("parallelism", 1)
        if replicas * parallelism > _MAX_INT32:
            problems.append(f"{where}: replicas x parallelism exceeds {_MAX_INT32}")
        problems += _dns1035_problems(rjob.get("groupName", "default"), f"{where}.groupName")
        problems += _dns1035_problems(f"{name}-{rname}-{replicas - 1}", f"{where}: longest Job name")
        mode = job_spec.get("completionMode") or "Indexed"  # the mutating webhook's default
        completions = job_spec.get("completions")
        if mode == "Indexed" and completions is not None:
            pod = f"{name}-{rname}-{replicas - 1}-{completions - 1}-abcde"
            problems += _dns1035_problems(pod, f"{where}: longest pod name")
        if mode == "Indexed" and completions is None:
            problems.append(f"{where}.template.spec.completions: required by an Indexed Job")
        depends_on = rjob.get("dependsOn") or []
        if len(depends_on) > 5:
            problems.append(f"{where}.dependsOn: {len(depends_on)} entries, at most 5")
        for dependency in depends_on:
            if dependency.get("name") not in names:
                problems.append(f"replicatedJob: {rname} cannot depend on replicatedJob: {dependency.get('name')}")
            elif dependency.get("name") == rname:
                problems.append(f"replicatedJob: {rname} depends on itself: it would never start")
            if dependency.get("status") not in ("Ready", "Complete"):
                problems.append(f"{where}.dependsOn: status {dependency.get('status')!r}, expected Ready or Complete")
        pod_spec = (job_spec.get("template") or {}).get("spec") or {}
        restart_policy = pod_spec.get("restartPolicy")
        if restart_policy not in ("Never", "OnFailure"):
            problems.append(
                f"{where}.template.spec.template.spec.restartPolicy: {restart_policy!r}, expected Never or OnFailure "
                "set explicitly (unset, the webhook makes it OnFailure: failures restart in place, unseen by the "
                "JobSet's failurePolicy)"
            )
        elif "podFailurePolicy" in job_spec and restart_policy != "Never":
            problems.append(f"{where}: podFailurePolicy needs restartPolicy Never")
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            problems.append(f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs")
    rule_names: list[str] = []
    for index, rule in enumerate((failure_policy or {}).get("rules") or []):
        where = f"spec.failurePolicy.rules[{index}]"
        rule_name = rule.get("name") or f"failurePolicyRule{index}"  # the mutating webhook's default
        rule_names.append(rule_name)
        if len(rule_name) > 128 or not _FAILURE_RULE_NAME.fullmatch(rule_name):
            problems.append(f"{where}.name: invalid failure policy rule name {rule_name!r}")
        if rule.get("action") in ("RestartJob", "RestartJobAndIgnoreMaxRestarts"):
            problems.append(f"{where}.action: {rule['action']} needs the RestartJob feature gate")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                problems.append(f"{where}: replicatedJob {target!r} does not appear in .spec.ReplicatedJobs")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOBSET_JOB_FAILURE_REASONS:
                problems.append(f"{where}: job failure reason {reason!r} is not recognized")
    for duplicate in sorted({n for n in rule_names if rule_names.count(n) > 1}):
        problems.append(f"spec.failurePolicy.rules: rule names are not unique ({duplicate!r})")
    return problems


def manifest_file(tmp_path: Path, *documents: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


# --------------------------------------------------------------------------- an operator on the emulator


class OperatorProcess:
    """`atlas operator` as users run it, against the emulator, with fast timers for tests."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        metrics_url: str = "http://127.0.0.1:1/metrics",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.args = args
        self.metrics_port = free_port()
        self.env = python_env(
            KUBECONFIG=str(kubeconfig),
            ATLAS_PROGRESS_INTERVAL="1",
            ATLAS_RETRY_DELAY="0.5",
            ATLAS_OPERATOR_METRICS_PORT=str(self.metrics_port),
            ATLAS_OPERATOR_METRICS_HOST="127.0.0.1",
            ATLAS_METRICS_URL_TEMPLATE=metrics_url,
            ATLAS_TRAINER_IMAGE="registry.example/atlas-trainer:test",
        )
        self.env.update(env or {})
        self.log = log
        self.proc = None

    def start(self) -> OperatorProcess:

        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "atlas_cli.main", "operator", "--verbose", *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as response:
            return response.status, response.read().decode()


class Cluster:
    def __init__(self, server: EmulatorThread, kubeconfig: Path, operator: OperatorProcess):
        self.server = server  # server.run(coroutine): kmock's async-only APIs, on the emulator's loop
        self.emu = server.emulator
        self.operator = operator
        self.api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        self.custom = kubernetes.client.CustomObjectsApi(self.api_client)
        self.created: list[dict] = []

    def restart_operator(self, log: Path, **env: str) -> None:
        """Stop the operator and start it again on the same cluster with ``env`` (a changed operator setting)."""
        self.operator.stop()
        self.operator = OperatorProcess(Path(self.operator.env["KUBECONFIG"]), log, env=env).start()

    # kubectl-like writes
    def apply(self, manifest: dict) -> dict:
        plural = "atlasteachers" if manifest["kind"] == "AtlasTeacher" else "atlastrainings"
        self.created.append(manifest)
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, plural, manifest)

    def delete_created(self) -> None:
        """Keep the shared operator's load flat: each test's runs go when it ends."""
        for manifest in self.created:
            if self.run(manifest) is not None:
                self.delete_run(manifest)
        self.created.clear()

    def patch_spec(self, manifest: dict, spec: dict) -> None:
        plural = "atlasteachers" if manifest["kind"] == "AtlasTeacher" else "atlastrainings"
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, plural, manifest["metadata"]["name"], {"spec": spec}
        )

    def delete_run(self, manifest: dict) -> None:
        plural = "atlasteachers" if manifest["kind"] == "AtlasTeacher" else "atlastrainings"
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, plural, manifest["metadata"]["name"])

    def set_job_conditions(self, name: str, *types: str, message: str = "") -> None:
        """What the Kubeflow controller writes: conditions in order, the last one True."""
        conditions = [
            {
                "type": t,
                "status": "True" if i == len(types) - 1 else "False",
                "reason": f"PyTorchJob{t}",
                "message": message or f"PyTorchJob {name} is {t.lower()}.",
            }
            for i, t in enumerate(types)
        ]
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", NS, "pytorchjobs", name, {"status": {"conditions": conditions}}
        )

    def finish_master_pod(self, name: str, message: str | None, exit_code: int = 0) -> dict:
        """What Kubeflow and the kubelet leave of job ``name``'s finished Master: Pod ``<name>-master-0``, owned by
        the job, its ``pytorch`` container terminated with ``message`` (the termination message)."""
        job = self.emu.get(PYTORCHJOBS, NS, name)
        core = kubernetes.client.CoreV1Api(self.api_client)
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": job["metadata"]["uid"]}
        core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": f"{name}-master-0", "ownerReferences": [{**owner, "controller": True}]},
                "spec": {"containers": [{"name": "pytorch", "image": "registry.example/atlas-trainer:test"}]},
            },
        )
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        if message is not None:
            terminated["message"] = message
        status = {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "image": "registry.example/atlas-trainer:test",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
        core.patch_namespaced_pod_status(
            f"{name}-master-0", NS, {"status": status}, _content_type="application/merge-patch+json"
        )
        return self.emu.get("v1/pods", NS, f"{name}-master-0")

    def kubelet_pod(self, name: str, template: dict, container: str, state: dict) -> dict:
        """Pod ``name`` as a job's controller makes it from pod ``template`` (its labels), with the container's
        state as the kubelet reports it, e.g. ``{"waiting": {"reason": "ImagePullBackOff", "message": ...}}``."""
        core = kubernetes.client.CoreV1Api(self.api_client)
        if self.emu.get("v1/pods", NS, name) is None:
            core.create_namespaced_pod(
                NS,
                {
                    "metadata": {"name": name, "labels": dict(template["metadata"]["labels"])},
                    "spec": {"containers": [{"name": container, "image": "registry.example/private:1"}]},
                },
            )
        status = {
            "phase": "Running" if "running" in state else "Pending",
            "containerStatuses": [
                {
                    "name": container,
                    "image": "registry.example/private:1",
                    "imageID": "",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        core.patch_namespaced_pod_status(name, NS, {"status": status}, _content_type="application/merge-patch+json")
        return self.emu.get("v1/pods", NS, name)

    def pod_reads(self, name: str) -> list:
        """The operator's requests for pod ``name``."""
        return self.emu.calls(
            lambda c: c.resource == "pods" and c.name == name and (c.user_agent or "").startswith("atlas-operator/")
        )

    # reads
    def run(self, manifest: dict) -> dict | None:
        resource = TEACHERS if manifest["kind"] == "AtlasTeacher" else TRAININGS
        return self.emu.get(resource, NS, manifest["metadata"]["name"])

    def status(self, manifest: dict) -> dict:
        return (self.run(manifest) or {}).get("status") or {}

    def wait_status(self, manifest: dict, predicate, what: str, timeout: float = TIMEOUT) -> dict:
        try:
            wait_for(lambda: predicate(self.status(manifest)), timeout=timeout, what=what, interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; status: {self.status(manifest)}\n{self.operator.output()[-3000:]}") from None
        return self.status(manifest)

    def condition(self, manifest: dict, type_: str) -> dict:
        return next((c for c in self.status(manifest).get("conditions", []) if c["type"] == type_), {})

    def events(self, name: str) -> list[dict]:
        return [e for e in self.emu.list("v1/events", NS) if e.get("involvedObject", {}).get("name") == name]


def children_of(name: str, teacher_run: bool = True) -> dict[str, tuple[str, str]]:
    """What the operator makes for a PyTorchJob run ``name`` (names from atlas_contract.names.ChildNames)."""
    owned = ChildNames(name)
    names = {
        "config": ("v1/configmaps", owned.config_map),
        "metrics": ("v1/services", owned.metrics),
        "rollout-svc": ("v1/services", owned.rollout),
        "rollout": ("apps/v1/deployments", owned.rollout),
        "job": (PYTORCHJOBS, owned.job),
        "network": (NETWORK_POLICIES, owned.network_policy),
        "trainer-network": (NETWORK_POLICIES, owned.trainer_network_policy),
    }
    if teacher_run:
        names |= {
            "student-svc": ("v1/services", owned.student),
            "student": ("apps/v1/deployments", owned.student),
        }
    return names


def start_cluster(
    tmp_path: Path,
    metrics_url: str = "http://127.0.0.1:1/metrics",
    operator_args=(),
    operator_env: dict[str, str] | None = None,
    namespaces: tuple[str, ...] = (),
    **emulator_options,
):
    """An emulator and an operator watching it; ``namespaces`` are created first (kopf serving named
    namespaces waits for their Namespace objects)."""
    server = EmulatorThread(**emulator_options).__enter__()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))
    for namespace in namespaces:
        core.create_namespace({"metadata": {"name": namespace}})
    operator = OperatorProcess(
        kubeconfig, tmp_path / "operator.log", metrics_url, tuple(operator_args), operator_env
    ).start()
    # Ready when kopf watches both kinds: a run created earlier could reach it twice (list, then replay).
    wait_for(
        lambda: (
            {c.resource for c in server.emulator.calls(lambda c: c.query.get("watch") == "true")}
            >= {"atlastrainings", "atlasteachers"}
        ),
        timeout=60,
        what="the operator watching runs",
    )
    return server, Cluster(server, kubeconfig, operator)


def wait_children(cluster: Cluster, name: str, teacher_run: bool = True) -> dict[str, dict]:
    wanted = children_of(name, teacher_run)
    wait_for(
        lambda: all(cluster.emu.get(r, NS, n) for r, n in wanted.values()), timeout=TIMEOUT, what=f"children of {name}"
    )
    return {key: cluster.emu.get(r, NS, n) for key, (r, n) in wanted.items()}


@contextlib.contextmanager
def own_cluster(tmp_path: Path, **options):
    """A cluster (emulator + operator) of a test's own, stopped when the test ends."""
    server, cluster = start_cluster(tmp_path, **options)
    try:
        yield cluster
    finally:
        cluster.operator.stop()
        server.__exit__(None, None, None)


def permissions_used(emu) -> set[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of every call the operator process made: its own client
    ("atlas-operator/…") and kopf's."""
    return {
        (c.group, c.resource + (f"/{c.subresource}" if c.subresource else ""), c.verb)
        for c in emu.calls(lambda c: (c.user_agent or "").startswith(("atlas-operator/", "kopf/")))
        if c.verb is not None
    }


# --------------------------------------------------------------------------- a Kueue stand-in

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def kueue_admit(
    api_client,
    name: str,
    namespace: str = NS,
    node_selector: dict[str, str] | None = None,
    cluster_queue: str = "cluster-queue",
) -> dict:
    """Admit JobSet ``name`` as Kueue v0.19's JobSet integration does (``startJob`` →
    ``JobSet.RunWithPodSetsInfo``): one patch that sets ``spec.suspend: false`` and merges into every replicated
    job's pod template the PodSetInfo — the flavor's node labels as ``nodeSelector``, the labels
    ``kueue.x-k8s.io/podset`` (the replicated job), ``local-queue-name``, ``cluster-queue-name`` and the annotation
    ``kueue.x-k8s.io/workload``. No Workload object, quota or flavor is emulated: the test decides when."""
    import hashlib

    custom = kubernetes.client.CustomObjectsApi(api_client)
    js = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name)
    queue = (js["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    assert queue, f"JobSet {name} has no {KUEUE_QUEUE_LABEL} label: Kueue would not manage it"
    assert js["spec"].get("suspend") is True, f"JobSet {name} is not suspended: Kueue admits suspended jobs"
    digest = hashlib.sha1(f"JobSet\njobset.x-k8s.io\n{name}\n{js['metadata']['uid']}".encode()).hexdigest()[:5]
    workload = f"jobset-{name}-{digest}"
    rjobs = copy.deepcopy(js["spec"]["replicatedJobs"])
    for rjob in rjobs:
        template = rjob["template"].setdefault("spec", {}).setdefault("template", {})
        meta = template.setdefault("metadata", {})
        meta["labels"] = {
            **(meta.get("labels") or {}),
            "kueue.x-k8s.io/podset": rjob["name"],
            "kueue.x-k8s.io/local-queue-name": queue,
            "kueue.x-k8s.io/cluster-queue-name": cluster_queue,
        }
        meta["annotations"] = {**(meta.get("annotations") or {}), "kueue.x-k8s.io/workload": workload}
        pod_spec = template.setdefault("spec", {})
        if node_selector:
            pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **node_selector}
    return custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        namespace,
        "jobsets",
        name,
        {"spec": {"suspend": False, "replicatedJobs": rjobs}},
    )


# --------------------------------------------------------------------------- Pod Security Standards, restricted

# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the restricted profile includes baseline).
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
BASELINE_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
BASELINE_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_profile_problems(pod_spec: dict[str, Any]) -> list[str]:
    """What the Pod Security admission would refuse in ``pod_spec`` (a PodSpec) at level ``restricted``: every
    baseline and restricted control of the Pod Security Standards, as the documentation states them; [] when the
    pod is admitted. Container-level fields are checked on containers, initContainers and ephemeralContainers."""
    problems: list[str] = []
    pod_context = pod_spec.get("securityContext") or {}
    containers = [
        (kind, c) for kind in ("containers", "initContainers", "ephemeralContainers") for c in pod_spec.get(kind) or []
    ]
    # baseline: HostProcess
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("securityContext.windowsOptions.hostProcess: must be unset or false")
    # baseline: host namespaces
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"{field}: must be unset or false")
    # baseline: hostPath volumes; restricted: volume types
    for volume in pod_spec.get("volumes") or []:
        types = set(volume) - {"name"}
        if "hostPath" in types:
            problems.append(f"volumes[{volume['name']}]: hostPath is forbidden")
        if not types <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volumes[{volume['name']}]: type {sorted(types - RESTRICTED_VOLUME_TYPES)} not allowed")
    # baseline: sysctls
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in BASELINE_SAFE_SYSCTLS:
            problems.append(f"securityContext.sysctls: {sysctl.get('name')} is not a safe sysctl")
    # baseline: AppArmor, SELinux, seccomp (not Unconfined) at pod level
    problems += _context_problems(pod_context, "securityContext")
    # restricted: running as non-root (pod level, or every container), seccomp RuntimeDefault/Localhost likewise
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_context.get("runAsUser") == 0:
        problems.append("securityContext.runAsUser: must not be 0")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append(f"securityContext.seccompProfile.type: {pod_seccomp}, expected RuntimeDefault or Localhost")
    for kind, container in containers:
        where = f"{kind}[{container.get('name')}]"
        context = container.get("securityContext") or {}
        problems += _context_problems(context, f"{where}.securityContext")
        if kind != "ephemeralContainers":
            for port in container.get("ports") or []:
                if port.get("hostPort"):
                    problems.append(f"{where}.ports: hostPort {port['hostPort']} is forbidden")
        if context.get("privileged"):
            problems.append(f"{where}.securityContext.privileged: must be unset or false")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess: must be unset or false")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{where}.securityContext.procMount: must be Default")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation: must be false")
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            problems.append(f"{where}: runAsNonRoot must be true (on the pod or the container)")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser: must not be 0")
        seccomp = (context.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (pod or container)")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop: must include ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{where}.securityContext.capabilities.add: only NET_BIND_SERVICE, got {sorted(added)}")
    return problems


def _context_problems(context: dict[str, Any], where: str) -> list[str]:
    """Baseline's AppArmor, SELinux and seccomp controls for one securityContext (pod or container)."""
    problems = []
    apparmor = (context.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in ("RuntimeDefault", "Localhost"):
        problems.append(f"{where}.appArmorProfile.type: {apparmor} is not allowed")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in BASELINE_SELINUX_TYPES:
        problems.append(f"{where}.seLinuxOptions.type: {selinux['type']} is not allowed")
    for field in ("user", "role"):
        if selinux.get(field):
            problems.append(f"{where}.seLinuxOptions.{field}: must be unset")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append(f"{where}.seccompProfile.type: Unconfined is forbidden")
    return problems


# --------------------------------------------------------------------------- NetworkPolicy evaluation


@dataclasses.dataclass(frozen=True)
class PodAt:
    """A pod as NetworkPolicy sees it: its namespace (and that namespace's labels), labels and named ports."""

    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = dataclasses.field(default_factory=dict)  # container port name → number

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}  # what the API server sets on every namespace


def _policy_types(spec: dict[str, Any]) -> list[str]:
    """spec.policyTypes, defaulted as the API server does: Ingress always, Egress when egress rules exist."""
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))


def _peer_matches(peer: dict[str, Any], policy_namespace: str, source: PodAt) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod traffic is judged by selectors here; no policy of ours uses ipBlock
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None:  # podSelector alone: pods of the policy's own namespace
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = label_selectors.matches(namespaces, source.namespace_labels)
    return in_namespace and label_selectors.matches(pods, source.labels)


def _port_matches(ports: list[dict[str, Any]] | None, port: int, protocol: str, target: PodAt) -> bool:
    if not ports:
        return True  # no ports: every port
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        number = target.ports.get(wanted) if isinstance(wanted, str) else wanted
        if number is not None and number <= port <= entry.get("endPort", number):
            return True
    return False


def ingress_allowed(
    policies: list[dict[str, Any]], source: PodAt, target: PodAt, port: int, protocol: str = "TCP"
) -> bool:
    """Whether NetworkPolicies ``policies`` let ``source`` open a connection to ``target``'s ``port``: a pod is
    isolated for ingress when any policy of its namespace selects it with policy type Ingress; then a connection is
    allowed when any such policy has a rule whose ``from`` (absent or empty: everyone) and ``ports`` (absent or
    empty: all) both match. Egress is not modelled (our policies have none)."""
    applicable = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and "Ingress" in _policy_types(p["spec"])
        and label_selectors.matches(p["spec"].get("podSelector"), target.labels)
    ]
    if not applicable:
        return True
    for policy in applicable:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            sources_ok = not peers or any(_peer_matches(p, policy["metadata"]["namespace"], source) for p in peers)
            if sources_ok and _port_matches(rule.get("ports"), port, protocol, target):
                return True
    return False
