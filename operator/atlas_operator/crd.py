"""The CRDs, generated from the API types in :mod:`atlas_operator.spec` (``python -m atlas_operator.generate``)."""

from __future__ import annotations

from typing import Any

from atlas_operator.cel_rules import crd_validations
from atlas_operator.run_status import RunStatus
from atlas_operator.schema import openapi_schema
from atlas_operator.spec import GROUP, KINDS, SHORT_NAMES, SPEC_TYPES, VERSION

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.reward"},
    {"name": "KL", "type": "number", "jsonPath": ".status.progress.kl"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
# AtlasTeacher also shows what its teaching did: the evaluation after training (spec.evaluation), once it is in.
TEACHER_COLUMNS = [{"name": "Delta", "type": "number", "jsonPath": ".status.result.evaluation.accuracyDelta"}]


def printer_columns(kind: str) -> list[dict[str, str]]:
    """``kubectl get`` columns of ``kind``: Age stays last."""
    *columns, age = PRINTER_COLUMNS
    return [*columns, *(TEACHER_COLUMNS if kind == "AtlasTeacher" else []), age]


def schema_at(schema: dict[str, Any], level: str) -> dict[str, Any]:
    """The schema of ``level`` (``spec.rollout``, ``spec.env[*]``: a list's items; ``""``: the whole object)."""
    for step in level.split(".") if level else []:
        schema = schema["properties"][step.removesuffix("[*]")]
        if step.endswith("[*]"):
            schema = schema["items"]
    return schema


def custom_resource_definition(kind: str) -> dict[str, Any]:
    plural = KINDS[kind]
    spec_schema = openapi_schema(SPEC_TYPES[kind])
    status_schema = openapi_schema(RunStatus)
    status_schema["properties"]["conditions"].update(
        {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    root = {
        "type": "object",
        "description": spec_schema.pop("description", kind),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # metadata.name declared, so that a rule on it can name it (fieldPath): the API server's refusal then
            # says metadata.name, as the operator does (a CRD may describe only name and generateName of metadata).
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    for level, validations in crd_validations(kind).items():  # the cross-field rules (cel_rules.py)
        schema_at(root, level)["x-kubernetes-validations"] = validations
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
                    "additionalPrinterColumns": printer_columns(kind),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
