"""The third-party schemas rendered objects must satisfy: the PyTorchJob (Kubeflow training-operator), JobSet and
Kubeflow Trainer TrainJob and ClusterTrainingRuntime CRDs, the very files a local cluster installs (atlas_cluster's
BACKEND_CRDS, at the versions of atlas_cluster/versions.py, read from their Go modules: ``go mod download``, as
``make kube`` does); the JobSet and Kubeflow webhooks' checks; OpenAPI validation and structural-schema pruning as
the API server applies them. Without Go the schema checks skip, saying so; under ATLAS_REQUIRE_KUBE=1 (CI) they fail,
as the real-Kubernetes tier does."""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml

# The backends' CRD files, by their name in the upstream tree (atlas_cluster/versions.py BACKEND_CRDS).
PYTORCHJOB_CRD_NAME = "kubeflow.org_pytorchjobs.yaml"
JOBSET_CRD_NAME = "jobset.x-k8s.io_jobsets.yaml"
TRAINJOB_CRD_NAME = "trainer.kubeflow.org_trainjobs.yaml"
RUNTIME_CRD_NAME = "trainer.kubeflow.org_clustertrainingruntimes.yaml"
KUBE_VERSION = "1.37.0"


@functools.cache
def _crd_files() -> dict[str, Path] | str:
    """Each backend CRD file a local cluster installs, by name, in its module's tree; or why there are none."""
    from atlas_cluster import versions
    from atlas_cluster.build import BuildError, module_dir

    try:
        trees = {crds: module_dir(crds.module, crds.version) for crds in versions.BACKEND_CRDS}
    except BuildError as exc:
        return str(exc)
    return {Path(name).name: trees[crds] / name for crds in versions.BACKEND_CRDS for name in crds.files}


@functools.cache
def _crd(name: str) -> dict[str, Any]:
    """The CRD file ``name`` (one of the *_CRD_NAME), read once (the JobSet's is 800 kB); the test skips without
    Go (fails under ATLAS_REQUIRE_KUBE=1)."""
    files = _crd_files()
    if isinstance(files, str):
        _unavailable(f"{name}: the backends' CRDs are read from their Go modules, and {files}")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(files[name].read_text(), Loader=loader)


def _unavailable(reason: str) -> None:
    import pytest

    if os.environ.get("ATLAS_REQUIRE_KUBE") == "1":
        pytest.fail(f"{reason} (ATLAS_REQUIRE_KUBE=1)", pytrace=False)
    pytest.skip(reason)


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


def pytorchjob_schema() -> dict[str, Any]:
    return crd_jsonschema(_crd(PYTORCHJOB_CRD_NAME))


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


def jobset_openapi_schema() -> dict[str, Any]:
    """The JobSet CRD's structural schema as the API server holds it (for :func:`pruned_fields`)."""
    return copy.deepcopy(_crd(JOBSET_CRD_NAME)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def jobset_schema() -> dict[str, Any]:
    """The JobSet CRD's schema as JSON Schema (for :func:`openapi_validate`), like :func:`pytorchjob_schema`."""
    return crd_jsonschema(_crd(JOBSET_CRD_NAME))


def crd_schemas(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(JSON Schema for :func:`openapi_validate`, structural schema for :func:`pruned_fields`) of the CRD ``name``
    (TRAINJOB_CRD_NAME, RUNTIME_CRD_NAME)."""
    crd = _crd(name)
    return crd_jsonschema(crd), copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


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
