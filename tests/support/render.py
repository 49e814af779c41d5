"""Builders the render and validation tests share: the examples, a run's rendered children by (kind, name), the
fields a refused run names, every pod template of a child, and runs of both kinds on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from atlas_operator.manifests import render_children
from atlas_operator.render import Images
from atlas_operator.validation import parse_run

from atlas_contract.errors import InvalidFields
from harness.env import REPO
from harness.manifests import teacher, training

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
POLICIES = ["NetworkPolicy", "NetworkPolicy"]  # <name>-network, <name>-network-trainer: applied first


def config_map_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "ConfigMap")


def children(manifest: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The run's rendered children by (kind, name), with the default images."""
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(parse_run(manifest), Images())}


def problem_fields(manifest: dict[str, Any]) -> list[str]:
    """The fields the refusal of ``manifest`` names (it must be refused), sorted."""
    with pytest.raises(InvalidFields) as caught:
        parse_run(manifest)
    return sorted(p.split(":")[0] for p in caught.value.problems)


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template of a rendered child: the PyTorchJob's Master and Worker, a Deployment's, each JobSet
    replicated job's, a TrainJob's (of the JobSet the Trainer builds)."""
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in obj["spec"]["replicatedJobs"]]
    if obj["kind"] == "TrainJob":  # its pods are the JobSet's the Kubeflow Trainer builds of it and the chart's runtime
        from atlas_operator.backends.trainjob import training_runtime

        from tests.support.trainer_jobset import build_jobset

        runtime = training_runtime(obj["spec"]["runtimeRef"]["name"], Images().trainer, max_restarts=3)
        return pod_templates(build_jobset(obj, runtime))
    return []


BOTH_KINDS_AND_BACKENDS = {
    "training": training(),
    "training-jobset": training(backend="JobSet", checkpoint={"pvc": "ckpt"}),
    "teacher": teacher(checkpoint={"pvc": "ckpt"}, reward={"configMapRef": {"name": "judges"}}),
    "teacher-jobset": teacher(backend="JobSet", queueName="q", reward={"configMapRef": {"name": "judges"}}),
}
