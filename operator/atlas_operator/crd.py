"""The CRDs, generated from the spec and status models (``python -m atlas_operator.generate``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_operator.schema import openapi_schema, spec_field
from atlas_operator.spec import GROUP, KINDS, SHORT_NAMES, SPEC_TYPES, VERSION

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Suspended", "Invalid")


@dataclass
class Condition:
    """Kubernetes-style condition."""

    type: str = spec_field(
        "Valid, PrerequisitesMet, ChildrenReady, RolloutReady, Training or SpecApplied", required=True
    )
    status: str = spec_field("True, False or Unknown", required=True, enum=("True", "False", "Unknown"))
    reason: str | None = spec_field("CamelCase reason")
    message: str | None = spec_field("what happened, for people")
    last_transition_time: str | None = spec_field("when status last changed (RFC 3339)")
    observed_generation: int | None = spec_field("metadata.generation this condition was computed from")


@dataclass
class Progress:
    """Mirrored from the trainer's :9400/metrics; a metric the trainer does not export is left out."""

    step: int | None = spec_field("global optimizer step (atlas_training_step)")
    reward: float | None = spec_field("mean reward of the last logged step (atlas_training_reward)")
    kl: float | None = spec_field("KL to the reference model (atlas_training_kl; absent when beta is 0)")
    updated_at: str | None = spec_field("when these values were read (RFC 3339)")


@dataclass
class Children:
    """Names of the objects the run owns."""

    pytorch_job: str | None = spec_field("PyTorchJob (kubeflow.org/v1)")
    rollout: str | None = spec_field("rollout Deployment and Service (trl vllm-serve)")
    student: str | None = spec_field("student Deployment and Service (vllm serve; AtlasTeacher)")
    config_map: str | None = spec_field("ConfigMap with run.yaml, accelerate.yaml, reward.yaml")
    metrics_service: str | None = spec_field("Service in front of the trainer's :9400/metrics")


@dataclass
class RunStatus:
    """Observed state of the run."""

    phase: str | None = spec_field("follows the PyTorchJob's last condition; Invalid = rejected spec", enum=PHASES)
    observed_generation: int | None = spec_field("metadata.generation last reconciled")
    conditions: list[Condition] = spec_field("latest observations", [])
    progress: Progress | None = spec_field("training progress")
    children: Children | None = spec_field("owned objects")
    kopf: dict[str, Any] = spec_field("the operator framework's bookkeeping (last handled spec, handler progress)", {})


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.reward"},
    {"name": "KL", "type": "number", "jsonPath": ".status.progress.kl"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def custom_resource_definition(kind: str) -> dict[str, Any]:
    plural = KINDS[kind]
    spec_schema = openapi_schema(SPEC_TYPES[kind])
    status_schema = openapi_schema(RunStatus)
    status_schema["properties"]["conditions"].update(
        {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "atlas", "app.kubernetes.io/part-of": "atlas-operator"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": SHORT_NAMES[kind],
                "categories": ["atlas"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": spec_schema.pop("description", kind),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }
