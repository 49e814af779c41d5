"""Helpers shared by the operator tests: run manifests and the third-party schemas they must satisfy."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "k8s-schemas"
PYTORCHJOB_CRD = SCHEMAS / "kubeflow.org_pytorchjobs.v1.9.0.yaml"
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


def crd_jsonschema(crd: dict[str, Any]) -> dict[str, Any]:
    return _jsonschema_of(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def pytorchjob_schema() -> dict[str, Any]:
    return crd_jsonschema(yaml.safe_load(PYTORCHJOB_CRD.read_text()))


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


def manifest_file(tmp_path: Path, *documents: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path
