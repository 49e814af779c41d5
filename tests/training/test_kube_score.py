"""An outside judge of the manifests the project writes: kube-score (``github.com/zegl/kube-score``, pinned in
atlas_cluster/versions.py, built by ``make kube-score``) over ``helm template`` of the chart in both RBAC scopes,
``atlas render`` of every example and the runs the tests build (tests/support/kube_score.py says what is judged):
no CRITICAL finding, with ``--ignore-container-cpu-limit`` (a CPU limit only throttles a server that could use an idle
core) and the checks of IGNORED left out, each for the reason beside it. Warnings are allowed (a server Deployment
of one replica with the Recreate strategy, by design: GPUs).

By hand, the counts of every input (``--all``: no check ignored):

    python -m tests.training.test_kube_score [--all]
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import kube_score
from tests.support.kube_score import CRITICAL, Finding

# Every check left out, with its reason. Nothing else is.
IGNORED: dict[str, str] = {
    "networkpolicy-targets-pod": (
        "a run's NetworkPolicies select its trainer pods, which the training-operator, JobSet or the Kubeflow Trainer "
        "make from the run's PyTorchJob, JobSet or TrainJob: kube-score sees no pod of a CRD, so it finds none "
        "selected (the chart's policy is judged: it selects the operator's Deployment's pods)"
    ),
    "service-targets-pod": (
        "a run's metrics Service selects its rank-0 trainer pod, which the training-operator, JobSet or the Kubeflow "
        "Trainer make from a CRD: kube-score cannot see it (the servers' Services, which select their Deployments' "
        "pods, and the chart's Service are judged)"
    ),
    "container-image-pull-policy": (
        "kube-score asks for Always so that every pull checks the pod's imagePullSecrets; the images here are "
        "pinned tags (the chart's appVersion, the trainer and vLLM images) of many GB, and Always would pull them "
        "again at every server or trainer restart and make a registry outage stop a run's restart. The chart "
        "leaves image.pullPolicy to the user (IfNotPresent by default); a cluster that must re-check credentials at "
        "every start enables the AlwaysPullImages admission plugin"
    ),
}
# Ignored on the rendered runs only: the chart's objects are all of Kubernetes' own kinds, and judged on them.
RUNS_ONLY = ("networkpolicy-targets-pod", "service-targets-pod")


def ignored_for(name: str) -> tuple[str, ...]:
    """The checks left out of input ``name``."""
    return tuple(c for c in IGNORED if not (name.startswith("chart/") and c in RUNS_ONLY))


INPUTS = kube_score.inputs()


@pytest.fixture(scope="module")
def binary():
    return kube_score.require_binary()


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_kube_score_finds_nothing_critical(binary, name):
    findings = kube_score.score(binary, INPUTS[name](), ignored_for(name))
    critical = [str(f) for f in findings if f.grade == CRITICAL]
    assert not critical, f"{name}: kube-score {kube_score.KUBE_SCORE}:\n" + "\n".join(critical)


def test_every_ignored_check_is_one_of_kube_scores_and_still_needed(binary):
    """IGNORED names checks kube-score has (``kube-score list``), and each one still finds something critical in some
    input, ignored or not: a check that no longer would is judged again."""
    listed = subprocess.run([str(binary), "list"], capture_output=True, text=True, timeout=60, check=True).stdout
    known = {line.split(",")[0] for line in listed.splitlines() if line}
    assert set(IGNORED) <= known, sorted(set(IGNORED) - known)
    assert set(RUNS_ONLY) <= set(IGNORED)
    found: set[str] = set()
    for make in INPUTS.values():
        found |= {f.check for f in kube_score.score(binary, make()) if f.grade == CRITICAL}
    assert set(IGNORED) <= found, f"ignored, yet never critical: {sorted(set(IGNORED) - found)}"


def test_server_pods_are_judged_with_their_requests_and_distinct_probes(binary):
    """The checks this judge exists for hold on the servers of a teacher run, on its own: requests and a memory limit
    (container-resources), ephemeral storage, a read-only root, liveness unlike readiness."""
    documents = INPUTS["examples/teacher-run.yaml"]()
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert len(deployments) == 2
    checks = {
        "container-resources",
        "container-ephemeral-storage-request-and-limit",
        "container-security-context-readonlyrootfilesystem",
        "pod-probes-identical",
    }
    findings = [f for f in kube_score.score(binary, deployments) if f.check in checks]
    assert not [str(f) for f in findings if f.grade == CRITICAL]


def _counts(ignore: bool) -> dict[str, dict[str, int]]:
    from atlas_cluster.build import ensure_kube_score

    binary = ensure_kube_score(kube_score.BINARY)
    table = {}
    for name, make in INPUTS.items():
        findings: list[Finding] = kube_score.score(binary, make(), ignored_for(name) if ignore else ())
        table[name] = dict(kube_score.counts(findings))
    return table


if __name__ == "__main__":
    every = "--all" in sys.argv[1:]
    flags = " ".join(kube_score.FLAGS)
    print(f"kube-score {kube_score.KUBE_SCORE} ({flags}), {'no check' if every else 'the checks of IGNORED'} ignored")
    for name, counted in _counts(ignore=not every).items():
        print(f"{name:36} critical {counted.get('CRITICAL', 0):3}  warning {counted.get('WARNING', 0):3}")
