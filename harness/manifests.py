"""Run manifests for the operator tests: an AtlasTraining and an AtlasTeacher as users write them (GPU-sized, in
namespace team-a), one that really trains here on CPU, and a manifest file for `atlas render`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

GROUP, VERSION = "atlas.arc.computer", "v1alpha1"
NS = "team-a"


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


def manifest_file(tmp_path: Path, *documents: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path
