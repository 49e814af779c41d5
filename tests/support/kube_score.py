"""kube-score (``github.com/zegl/kube-score``, atlas_cluster/versions.py pins it), an outside judge of the manifests the
project writes: what it is given and how its verdict is counted. tests/training/test_kube_score.py holds the checks it
ignores, each with its reason, and asserts the verdict.

The binary is built by ``make kube-score`` (``$ATLAS_KUBE_SCORE_BIN`` names another); when it is missing and Go is
there it is built here (under a minute cold), else the tests that use it skip saying ``make kube-score`` — unless
``ATLAS_REQUIRE_KUBE=1`` (.ci/run), which makes that a failure, as for the S3 server (harness/s3.py).

What is judged (:func:`inputs`): ``helm template`` of the chart in both RBAC scopes, ``atlas render`` of every
``examples/*.yaml`` (the children of each run in it, as ``atlas render`` prints them), and the children of the
runs harness/manifests.py builds (each kind on each backend). kube-score scores only Kubernetes' own kinds:
the PyTorchJob, JobSet and TrainJob (and the pods their controllers make of them) are invisible to it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from atlas_cluster.build import BuildError, ensure_kube_score, kube_score_binary
from atlas_cluster.versions import KUBE_SCORE
from harness.env import REPO

__all__ = ["KUBE_SCORE", "Finding", "inputs", "require_binary", "score"]

# Read at import, before tests/conftest.py's atlas_cache moves ATLAS_CACHE_DIR to a temporary folder.
BINARY = Path(os.environ.get("ATLAS_KUBE_SCORE_BIN") or kube_score_binary())
REQUIRE = os.environ.get("ATLAS_REQUIRE_KUBE") == "1"

CHART = REPO / "charts" / "atlas-operator"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# What kube-score's checks assume of the cluster: the oldest the chart supports (Chart.yaml's kubeVersion >=1.29).
KUBERNETES_VERSION = "v1.29"
# The flags every judgement runs with: no CPU limit is asked for (a limit throttles a server that could use an idle
# core; the requests are what scheduling and eviction read).
FLAGS = ("--ignore-container-cpu-limit", "--kubernetes-version", KUBERNETES_VERSION)
CRITICAL, WARNING = 1, 5  # kube-score's grades (scorecard.GradeCritical, GradeWarning)
GRADES = {CRITICAL: "CRITICAL", WARNING: "WARNING"}


def require_binary() -> Path:
    """kube-score's binary, built when missing and Go is there; else skip (or fail under ATLAS_REQUIRE_KUBE=1) saying
    ``make kube-score``."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    try:
        if "ATLAS_KUBE_SCORE_BIN" in os.environ:
            raise BuildError(f"ATLAS_KUBE_SCORE_BIN={BINARY} is not an executable")
        return ensure_kube_score(BINARY, log=lambda line: None)
    except BuildError as exc:
        message = f"kube-score: {exc} (make kube-score)"
        if REQUIRE:
            pytest.fail(message + " (ATLAS_REQUIRE_KUBE=1)", pytrace=False)
        pytest.skip(message)


@dataclass(frozen=True)
class Finding:
    """One check's grade on one object (the lines kube-score's human output prints as ``[CRITICAL]``, ``[WARNING]``),
    with what it says about each container."""

    obj: str  # Kind/group/version/namespace/name, as kube-score names it
    check: str  # the check's id (kube-score list)
    grade: int
    comments: tuple[str, ...]

    def __str__(self) -> str:
        said = "; ".join(self.comments)
        return f"{GRADES.get(self.grade, self.grade)} {self.check} on {self.obj}: {said}"


def score(binary: Path, documents: list[dict[str, Any]], ignored: tuple[str, ...] = ()) -> list[Finding]:
    """kube-score's critical and warning findings over ``documents`` (a multi-document YAML on stdin), the checks of
    ``ignored`` left out."""
    command = [str(binary), "score", "-o", "json", *FLAGS]
    for check in ignored:
        command += ["--ignore-test", check]
    proc = subprocess.run(
        [*command, "-"],
        input=yaml.safe_dump_all(documents, sort_keys=False),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode not in (0, 1) or not proc.stdout.strip():  # 1: a critical finding
        raise RuntimeError(f"kube-score exited {proc.returncode}: {proc.stderr.strip()}")
    findings = []
    for scored in json.loads(proc.stdout):
        for check in scored["checks"]:
            if check["skipped"] or check["grade"] not in GRADES:
                continue
            comments = tuple(
                f"{c.get('path') + ' -> ' if c.get('path') else ''}{c['summary']}" for c in check["comments"] or ()
            )
            findings.append(Finding(scored["object_name"], check["check"]["id"], check["grade"], comments))
    return findings


def counts(findings: list[Finding]) -> Counter:
    """Findings by grade name: ``{"CRITICAL": n, "WARNING": m}``."""
    return Counter(GRADES[f.grade] for f in findings)


def helm_template(*values: str) -> list[dict[str, Any]]:
    from atlas_cluster.helm_kubectl import helm_binary

    proc = subprocess.run(
        [str(helm_binary()), "template", "atlas", str(CHART), "--namespace", "atlas-system", *values],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"helm template {' '.join(values)}: {proc.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def rendered(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``atlas render`` prints for these runs: every child of each, with the operator's settings from the
    environment (its images, default backend and NetworkPolicy settings)."""
    from atlas_operator.config import OperatorConfig
    from atlas_operator.manifests import render_children
    from atlas_operator.reconcile import reward_yaml
    from atlas_operator.validation import parse_run

    settings = OperatorConfig.from_env()
    children = []
    for manifest in manifests:
        run = parse_run(manifest, default_backend=settings.default_backend)
        children += render_children(run, settings.images, reward_yaml(run), settings.network)
    return children


def example_runs(path: Path) -> list[dict[str, Any]]:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return [doc for doc in documents if doc.get("kind") in ("AtlasTraining", "AtlasTeacher")]


def builder_runs() -> dict[str, dict[str, Any]]:
    """The runs the tests build (harness/manifests.py), each kind on each backend."""
    from harness.manifests import teacher, tiny_training, training

    return {
        "training": training(),
        "training-jobset": training("training-jobset", backend="JobSet", checkpoint={"pvc": "ckpt"}),
        "training-trainjob": training("training-trainjob", backend="TrainJob"),
        "teacher": teacher(checkpoint={"pvc": "ckpt"}, reward={"configMapRef": {"name": "judges"}}),
        "teacher-jobset": teacher("teacher-jobset", backend="JobSet", queueName="q"),
        "teacher-trainjob": teacher("teacher-trainjob", backend="TrainJob"),
        "tiny-training": tiny_training("tiny-training"),
    }


# The chart's two RBAC scopes (values.yaml rbac.scope); the namespaced one with every optional object on.
CHART_VALUES: dict[str, tuple[str, ...]] = {
    "cluster": (),
    "namespaced": (
        "--set", "rbac.scope=namespaced",
        "--set", "watchNamespaces={ml-team,research}",
        "--set", "monitoring.serviceMonitor.enabled=true",
        "--set", "monitoring.podMonitor.enabled=true",
        "--set", "alerts.prometheusRule.enabled=true",
        "--set", "podSecurity.namespaces={ml-team}",
    ),
}  # fmt: skip  # a command line: each flag beside its value


def inputs() -> dict[str, Callable[[], list[dict[str, Any]]]]:
    """Every input judged, by name: ``chart/<scope>``, ``examples/<file>``, ``builders/<run>``; each makes its
    documents when called."""
    made: dict[str, Callable[[], list[dict[str, Any]]]] = {}
    for scope, values in CHART_VALUES.items():
        made[f"chart/{scope}"] = lambda values=values: helm_template(*values)
    for path in EXAMPLES:
        made[f"examples/{path.name}"] = lambda path=path: rendered(example_runs(path))
    for name, manifest in builder_runs().items():
        made[f"builders/{name}"] = lambda manifest=manifest: rendered([manifest])
    return made
