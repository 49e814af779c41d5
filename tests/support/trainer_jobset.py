"""The JobSet the Kubeflow Trainer v2.3.0 builds from a TrainJob and its ClusterTrainingRuntime, and what its admission
webhooks refuse, as pure functions: the render-level tests (tests/unit/test_render_trainjob.py, tests/support/render.py)
compare the TrainJob backend's pods with the other backends' without a cluster. No controller: the real Trainer
runs in tests/kube/ (its webhooks judge the chart's runtime at ``helm install`` and each run's TrainJob), and
tests/kube/test_runs.py checks :func:`build_jobset` against the JobSet the real Trainer makes of a run.

Read from kubeflow/trainer at tag v2.3.0 (commit 658725bd):

* ``pkg/runtime/core/trainingruntime.go`` (newRuntimeInfo, mergeRuntimePatches): the runtime's JobSet template,
  each ``runtimePatches[]`` entry strategically merged into its spec in list order (replicated jobs by name,
  containers, volumes, env by name, volumeMounts by mountPath, tolerations replaced), the JobSet's labels and
  annotations from the template's metadata and the patches' (never the TrainJob's own);
* ``pkg/runtime/framework/plugins/jobset/{jobset,builder}.go``: the job labelled
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` gets replicas 1 and, in its container ``node``, the
  trainer's image, command, args and env (upserted), its resources merged per key; every replicated job
  ``parallelism = completions`` = its count (the trainer's: trainer.numNodes, else mlPolicy.numNodes, else 1);
  ``suspend`` from the TrainJob; the TrainJob as controller owner;
* ``pkg/runtime/framework/plugins/torch/torch.go``: with ``spec.trainer`` set, PET_NNODES, PET_NPROC_PER_NODE
  (numProcPerNode, else "auto" with GPUs, else the CPU count), PET_NODE_RANK (the completion index),
  PET_MASTER_ADDR ``<trainjob>-node-0-0.<trainjob>``, PET_MASTER_PORT 29500, and container port 29500;
* ``pkg/webhooks/trainjob_webhook.go``, ``plugins/{jobset,torch}`` Validate, ``trainingruntime_webhook.go``.

Not emulated: the runtime snapshot ConfigMap, initializers, envInjection, MPI/JAX/XGBoost policies, Volcano and
coscheduling, activeDeadlineSeconds, server-side-apply field ownership (a build is a whole new JobSet).
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_CONTAINER = "node"
MASTER_PORT = 29500
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# Lists a strategic merge patch merges by key (k8s.io/api patchMergeKey tags); any other list is replaced.
_MERGE_KEYS = {
    "replicatedJobs": "name",
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
}
_DOMAIN_PREFIXED_PATH = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/\S+")


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """``patch`` merged into ``base`` as a strategic merge patch does for these types."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            merged[name] = strategic_merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        merge_key = _MERGE_KEYS[key]
        merged = [copy.deepcopy(item) for item in base]
        for item in patch:
            at = next((i for i, old in enumerate(merged) if old.get(merge_key) == item.get(merge_key)), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[at] = strategic_merge(merged[at], item)
        return merged
    return copy.deepcopy(patch)


def _upsert(items: list[dict[str, Any]], new: list[dict[str, Any]], key: str = "name") -> list[dict[str, Any]]:
    out = [dict(item) for item in items]
    for item in new:
        at = next((i for i, old in enumerate(out) if old.get(key) == item.get(key)), None)
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = copy.deepcopy(item)
    return out


def _container(job: dict[str, Any], name: str) -> dict[str, Any] | None:
    pod = job["template"]["spec"]["template"]["spec"]
    return next((c for c in pod.get("containers") or [] if c.get("name") == name), None)


def _gpus(resources: dict[str, Any]) -> int:
    for section in ("requests", "limits"):
        for resource, amount in (resources.get(section) or {}).items():
            if "gpu" in resource:
                return int(amount)
    return 0


def _cpus(resources: dict[str, Any]) -> int:
    for section in ("requests", "limits"):
        amount = (resources.get(section) or {}).get("cpu")
        if amount is not None:
            text = str(amount)
            return math.ceil(int(text[:-1]) / 1000) if text.endswith("m") else math.ceil(float(text))
    return 0


def build_jobset(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet the Trainer controller applies for ``trainjob`` on ``runtime`` (see the module docstring)."""
    meta = trainjob["metadata"]
    name = meta["name"]
    tj_spec = trainjob.get("spec") or {}
    template = runtime["spec"]["template"]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    annotations = dict((template.get("metadata") or {}).get("annotations") or {})
    spec = copy.deepcopy(template["spec"])
    order = [rjob["name"] for rjob in spec["replicatedJobs"]]
    for patch in tj_spec.get("runtimePatches") or []:
        patch_template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        labels.update((patch_template.get("metadata") or {}).get("labels") or {})
        annotations.update((patch_template.get("metadata") or {}).get("annotations") or {})
        spec = strategic_merge(spec, patch_template.get("spec") or {})
    spec["replicatedJobs"].sort(key=lambda rjob: order.index(rjob["name"]))
    policy = runtime["spec"].get("mlPolicy")
    trainer = tj_spec.get("trainer")
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        is_trainer = ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL) == "trainer"
        count = job_spec.get("parallelism", 1)
        if is_trainer and policy is not None:
            count = (trainer or {}).get("numNodes") or policy.get("numNodes") or 1
        job_spec["parallelism"] = job_spec["completions"] = count
        if not is_trainer:
            continue
        rjob["replicas"] = 1
        container = _container(rjob, TRAINER_CONTAINER)
        if container is None or trainer is None:
            continue
        for field in ("image", "command", "args"):
            if trainer.get(field) is not None:
                container[field] = copy.deepcopy(trainer[field])
        if trainer.get("resourcesPerNode"):
            merged = container.get("resources") or {}
            for section, amounts in trainer["resourcesPerNode"].items():
                merged[section] = {**(merged.get(section) or {}), **amounts}
            container["resources"] = merged
        container["env"] = _upsert(container.get("env") or [], trainer.get("env") or [])
        if policy is not None and "torch" in policy:
            resources = trainer.get("resourcesPerNode") or container.get("resources") or {}
            procs = trainer.get("numProcPerNode")
            if procs is None:
                procs = "auto" if _gpus(resources) else max(1, _cpus(resources))
            container["env"] = _upsert(
                container["env"],
                [
                    {"name": "PET_NNODES", "value": str(count)},
                    {"name": "PET_NPROC_PER_NODE", "value": str(procs)},
                    {
                        "name": "PET_NODE_RANK",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
                    },
                    {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
                    {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
                ],
            )
            container["ports"] = _upsert(
                container.get("ports") or [], [{"containerPort": MASTER_PORT, "protocol": "TCP"}], "containerPort"
            )
    spec["suspend"] = bool(tj_spec.get("suspend"))
    jobset_meta: dict[str, Any] = {
        "name": name,
        "namespace": meta.get("namespace", "default"),
        "ownerReferences": [
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "name": name,
                "uid": meta.get("uid"),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if labels:
        jobset_meta["labels"] = labels
    if annotations:
        jobset_meta["annotations"] = annotations
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": jobset_meta, "spec": spec}


def trainjob_webhook_problems(trainjob: dict[str, Any], runtime: dict[str, Any] | None) -> list[str]:
    """What the Trainer's TrainJob validating webhook refuses on create (its runtime's check, the jobset and torch
    plugins' Validate); [] when admitted."""
    spec = trainjob.get("spec") or {}
    ref = spec.get("runtimeRef") or {}
    if runtime is None:
        return [
            f'spec.RuntimeRef: Invalid value: clustertrainingruntimes.trainer.kubeflow.org "{ref.get("name")}" '
            "not found: specified clusterTrainingRuntime must be created before the TrainJob is created"
        ]
    problems = []
    reserved = [e["name"] for e in (spec.get("trainer") or {}).get("env") or [] if e.get("name") in RESERVED_ENV]
    if reserved and "torch" in (runtime["spec"].get("mlPolicy") or {}):
        problems.append(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}")
    jobs = {rjob["name"]: rjob for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for index, patch in enumerate(spec.get("runtimePatches") or []):
        where = f"spec.runtimePatches[{index}]"
        if not _DOMAIN_PREFIXED_PATH.fullmatch(patch.get("manager") or ""):
            problems.append(f'{where}.manager: must be a domain-prefixed path (such as "acme.io/foo")')
        patch_spec = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")) or {}
        for rjob in patch_spec.get("replicatedJobs") or []:
            if rjob.get("name") not in jobs:
                problems.append(f"{where}: must not have replicated job that doesn't exist in the runtime job template")
                continue
            pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            runtime_pod = jobs[rjob["name"]]["template"]["spec"]["template"]["spec"]
            for kind in ("containers", "initContainers"):
                known = {c.get("name") for c in runtime_pod.get(kind) or []}
                for container in pod.get(kind) or []:
                    if container.get("name") not in known:
                        problems.append(
                            f"{where}: must not have {kind[:-1]} that doesn't exist in the runtime job {rjob['name']}"
                        )
                    if container.get("env") and container.get("name") in (
                        TRAINER_CONTAINER,
                        "dataset-initializer",
                        "model-initializer",
                    ):
                        problems.append(f"{where}: env of container {container['name']!r} must be set in spec.trainer")
    return problems


def runtime_webhook_problems(runtime: dict[str, Any]) -> list[str]:
    """What the Trainer's (Cluster)TrainingRuntime validating webhook refuses: a job labelled as the trainer (or
    an initializer) must have replicas 1 and the container of its step."""
    problems = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        step = ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
        if step is None:
            continue
        if rjob.get("replicas", 1) != 1:
            problems.append(f"{rjob['name']}: replicas always must be 1")
        wanted = TRAINER_CONTAINER if step == "trainer" else step
        if _container(rjob, wanted) is None:
            problems.append(f"{rjob['name']}: must contain the required container for the ancestor: {step}")
    if len([m for m in ("torch", "mpi", "jax", "xgboost", "flux") if m in (runtime["spec"].get("mlPolicy") or {})]) > 1:
        problems.append("spec.mlPolicy: Only one of the policy can be configured")
    return problems
