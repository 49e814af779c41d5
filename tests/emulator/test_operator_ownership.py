"""The operator touches only what it made, and an upgrade never restarts training.

Against the API emulator with a real `atlas operator` (foreign objects under a run's child names, left byte for byte
through the run's life and deletion by the real garbage collector, are tests/kube/test_ownership.py's): a run goes on
once the object in its way is gone; two runs of different kinds with one name do not fight; an operator restarted
with other settings, over the objects the previous release made (tests/fixtures/upgrade/), writes nothing to a
running job or server; a spec change still recreates.
"""

from __future__ import annotations

import copy
import itertools

import kubernetes
import pytest
from atlas_operator.ticker import tick_line

from harness.kube_emulator import PYTORCHJOBS, TEACHERS, TRAININGS, EmulatorThread, write_kubeconfig
from harness.manifests import NS, teacher, training
from harness.polling import wait_for
from tests.support import upgrade_fixtures
from tests.support.operator_cluster import (
    TIMEOUT,
    OperatorProcess,
    cleanup_runs,  # noqa: F401  (autouse: each test's runs deleted)
    own_cluster,
    wait_children,
)

pytestmark = pytest.mark.timeout(300)
OPERATOR = ("atlas-operator/", "kopf/")
WORKLOADS = ("pytorchjobs", "jobsets", "deployments", "configmaps")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with own_cluster(tmp_path_factory.mktemp("cluster")) as shared:
        yield shared


def operator_writes(cluster, resource: str | None = None, name: str | None = None, start: int = 0) -> list:
    return [
        c
        for c in cluster.emu.calls(start=start)
        if c.is_write
        and (c.user_agent or "").startswith(OPERATOR)
        and (resource is None or c.resource == resource)
        and (name is None or c.name == name)
    ]


def operator_reads(cluster, resource: str, name: str) -> int:
    return len(
        cluster.emu.calls(
            lambda c: (
                c.verb == "get" and c.resource == resource and c.name == name and c.user_agent.startswith(OPERATOR)
            )
        )
    )


def conflict(cluster, manifest) -> dict:
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "ChildrenReady").get("reason") == "NameConflict",
        "ChildrenReady=False NameConflict",
    )
    return cluster.condition(manifest, "ChildrenReady")


def test_the_run_goes_on_by_itself_once_the_object_in_its_way_is_gone(cluster):
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "waits-config"}, "data": {"x": "1"}})
    manifest = teacher("waits")
    run = cluster.apply(manifest)
    assert "ConfigMap waits-config (no controller" in conflict(cluster, manifest)["message"]
    core.delete_namespaced_config_map("waits-config", NS)
    children = wait_children(cluster, "waits")
    cluster.wait_status(
        manifest, lambda s: cluster.condition(manifest, "ChildrenReady").get("status") == "True", "ChildrenReady"
    )
    for child in children.values():
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == run["metadata"]["uid"] and ref["controller"] is True


def test_an_atlas_training_and_an_atlas_teacher_of_one_name_do_not_fight(cluster):
    first = training("same-name")
    cluster.apply(first)
    made = wait_children(cluster, "same-name", teacher_run=False)
    versions = {key: obj["metadata"]["resourceVersion"] for key, obj in made.items()}
    second = teacher("same-name")
    cluster.apply(second)
    status = cluster.wait_status(second, lambda s: s.get("phase") == "Invalid", "the second run Invalid")
    valid = cluster.condition(second, "Valid")
    assert valid["reason"] == "NameTaken"
    assert valid["message"].startswith(f"metadata.name: AtlasTraining {NS}/same-name already uses this name")
    assert not status.get("children")
    assert cluster.emu.get("apps/v1/deployments", NS, "same-name-student") is None
    # Its timer looks again (the name may be free by now) and still leaves the first run's children alone.
    wait_for(
        lambda: operator_reads(cluster, "deployments", "same-name-student") >= 3, timeout=TIMEOUT, what="its retries"
    )
    now = wait_children(cluster, "same-name", teacher_run=False)
    assert {key: obj["metadata"]["resourceVersion"] for key, obj in now.items()} == versions
    assert cluster.status(first)["phase"] != "Invalid"

    cluster.delete_run(first)  # the first goes, and the garbage collector takes its children: the second starts
    wait_for(lambda: cluster.emu.get(TRAININGS, NS, "same-name") is None, timeout=TIMEOUT, what="first run gone")
    cluster.server.run(cluster.emu.collect_garbage())
    children = wait_children(cluster, "same-name", teacher_run=True)
    owner = cluster.emu.get(TEACHERS, NS, "same-name")["metadata"]["uid"]
    assert all(obj["metadata"]["ownerReferences"][0]["uid"] == owner for obj in children.values())


def test_a_queue_change_on_an_admitted_job_is_a_spec_change_not_a_patch(cluster):
    """Kueue refuses a queue-name change on a job it admitted: without a checkpoint volume the run keeps its job and
    says so (SpecApplied=False), the job's label untouched."""
    manifest = training("requeue", queueName="team-a-queue")
    cluster.apply(manifest)
    wait_children(cluster, "requeue", teacher_run=False)
    cluster.custom.patch_namespaced_custom_object(  # what Kueue does when it admits the job
        "kubeflow.org", "v1", NS, "pytorchjobs", "requeue", {"spec": {"runPolicy": {"suspend": False}}}
    )
    cluster.set_job_conditions("requeue", "Created", "Running")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    start = len(cluster.emu.calls())
    cluster.patch_spec(manifest, {"queueName": "team-b-queue"})
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "SpecApplied").get("reason") == "RestartNeedsCheckpoint",
        "SpecApplied=False RestartNeedsCheckpoint",
    )
    job = cluster.emu.get(PYTORCHJOBS, NS, "requeue")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    assert operator_writes(cluster, "pytorchjobs", "requeue", start=start) == []


# --------------------------------------------------------------------------- upgrades


UPGRADED_SETTINGS = {
    "ATLAS_TRAINER_IMAGE": "registry.example/atlas-trainer:9.9.9",
    "ATLAS_ROLLOUT_IMAGE": "registry.example/atlas-vllm:9.9.9",
    "ATLAS_MONITORING_NAMESPACE": "observability",
    "ATLAS_OPERATOR_NAMESPACE": "atlas-system",
}
LEGACY_RUN = "grpo-run"  # its children lose the revision annotations: made by a release before they existed


def rendered_by_an_earlier_release(child: dict) -> dict:
    """What an earlier renderer made differently: an env var the current one does not render, and (one run) no
    revision annotations at all."""
    for container in _containers(child):
        container.setdefault("env", []).append({"name": "ATLAS_RENDERED_BY", "value": "an earlier release"})
    if child["kind"] == "ConfigMap":
        child["data"] = {key: value + "\n# rendered by an earlier release\n" for key, value in child["data"].items()}
    if LEGACY_RUN in child["metadata"]["name"]:
        annotations = child["metadata"].get("annotations") or {}
        for key in [
            k for k in annotations if k.startswith("atlas.arc.computer/") and k != "atlas.arc.computer/spec-hash"
        ]:
            del annotations[key]
    return child


def _containers(obj: dict) -> list[dict]:
    spec = obj.get("spec") or {}
    templates = [r["template"] for r in (spec.get("pytorchReplicaSpecs") or {}).values()]
    templates += [r["template"]["spec"]["template"] for r in spec.get("replicatedJobs") or []]
    if obj["kind"] == "Deployment":
        templates.append(spec["template"])
    return [c for template in templates for c in template["spec"]["containers"]]


def test_an_upgraded_operator_leaves_running_jobs_and_servers_alone(tmp_path):
    versions = sorted(p.name for p in upgrade_fixtures.FIXTURES.iterdir())
    assert versions, "no recorded release in tests/fixtures/upgrade (python -m tests.support.upgrade_fixtures)"
    with EmulatorThread() as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        runs = upgrade_fixtures.load(client, versions[-1], change=rendered_by_an_earlier_release)
        emu = server.emulator
        made = {
            (c["kind"], c["metadata"]["name"]): c for c in _all(emu, upgrade_fixtures.CHILD_RESOURCES) if c is not None
        }
        start = len(emu.calls())
        operator = OperatorProcess(kubeconfig, tmp_path / "operator.log", env=UPGRADED_SETTINGS).start()
        try:
            loader = upgrade_fixtures.Loader(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))
            jobs = {
                (r["metadata"]["name"], "JobSet" if r["status"]["children"].get("jobSet") else "PyTorchJob")
                for r in runs
            }
            # Status is still refreshed: each job's new state reaches its run, round after round.
            for round_ in (1, 2, 3):
                for name, kind in jobs:
                    loader.patch_status(kind, "default", name, upgrade_fixtures.running_status(kind, round_))
                for run in runs:
                    wait_for(
                        lambda r=run, n=round_: _refreshed(emu, r, n),
                        timeout=TIMEOUT,
                        what=f"{run['metadata']['name']} round {round_}",
                    )
            for run in runs:  # and the timers went by several times
                name = run["metadata"]["name"]
                wait_for(lambda n=name: operator.output().count(tick_line("default", n)) >= 3, TIMEOUT)
            writes = [
                c
                for c in emu.calls(start=start)
                if c.is_write and c.resource in WORKLOADS and (c.user_agent or "").startswith(OPERATOR)
            ]
            assert writes == [], [f"{c.method} {c.resource}/{c.name}" for c in writes]
            for (kind, name), before in made.items():
                now = emu.get(upgrade_fixtures.CHILD_RESOURCES[kind], "default", name)
                assert now["metadata"]["uid"] == before["metadata"]["uid"], f"{kind} {name} was made again"
            for run in runs:
                status = _run(emu, run)["status"]
                assert status["phase"] == "Running"
                applied = next(c for c in status["conditions"] if c["type"] == "SpecApplied")
                assert applied["status"] == "True", applied

            # A spec change afterwards recreates the job, with the new rendering (the new default image).
            for name, kind in sorted(jobs):
                run = next(r for r in runs if r["metadata"]["name"] == name)
                if not run["spec"].get("checkpoint", {}).get("pvc"):
                    continue
                old = made[(kind, name)]["metadata"]["uid"]
                training_spec = copy.deepcopy(run["spec"]["training"])
                training_spec["learningRate"] = training_spec.get("learningRate", 1e-6) * 2
                loader.patch_spec(run["kind"], "default", name, {"training": training_spec})
                resource = upgrade_fixtures.CHILD_RESOURCES[kind]
                new = wait_for(
                    lambda r=resource, n=name, u=old: (
                        (j := emu.get(r, "default", n)) and j["metadata"]["uid"] != u and j
                    ),
                    timeout=TIMEOUT,
                    what=f"{kind} {name} recreated",
                )
                images = {c["image"] for c in _containers(new)}
                assert UPGRADED_SETTINGS["ATLAS_TRAINER_IMAGE"] in images
                assert new["metadata"]["annotations"]["atlas.arc.computer/run-generation"] == "2"
        finally:
            operator.stop()


def _all(emu, resources: dict[str, str]) -> list[dict]:
    return [obj for resource in resources.values() for obj in emu.list(resource, "default")]


def _run(emu, run: dict) -> dict:
    return emu.get(upgrade_fixtures.RUN_RESOURCES[run["kind"]], "default", run["metadata"]["name"])


def _refreshed(emu, run: dict, round_: int) -> bool:
    status = (_run(emu, run) or {}).get("status") or {}
    if run["status"]["children"].get("jobSet"):
        return status.get("restarts") == round_
    training_condition = next((c for c in status.get("conditions") or [] if c["type"] == "Training"), {})
    return training_condition.get("message") == f"PyTorchJob is running (round {round_})"


def test_a_retry_after_is_honoured_and_spread():
    """APF answers every request it rejects in one second with the same Retry-After: the workers wait it and up to
    half of it more, each its own draw, so they do not all come back in the same second (atlas_operator/kube.py)."""
    from atlas_operator.kube import RETRY_AFTER_JITTER, jittered

    waits = [jittered(2.0) for _ in range(32)]
    assert all(2.0 <= w <= 2.0 * (1 + RETRY_AFTER_JITTER) for w in waits)
    assert len({int(w * 10) for w in waits}) > 5  # spread over the extra second, not bunched in one tenth
    assert jittered(0.0) == 0.0 and jittered(1.0, lambda: 1.0) == 1.0 + RETRY_AFTER_JITTER


def test_kopfs_retries_are_spread_and_never_given_up():
    """kopf's own requests (its watches of the runs, its status writes) back off with RetryForever: kopf's steps,
    then the cap, forever, each spread as the operator's own Retry-After waits are (reconcile/retry.py)."""
    from atlas_operator.kube import RETRY_AFTER_JITTER
    from atlas_operator.reconcile.retry import KOPF_BACKOFFS, RetryForever

    plain = list(itertools.islice(RetryForever(5.0, lambda: 0.0), 12))
    assert plain == [s for s in KOPF_BACKOFFS if s < 5.0] + [5.0] * (12 - len([s for s in KOPF_BACKOFFS if s < 5.0]))
    highest = list(itertools.islice(RetryForever(5.0, lambda: 1.0), 12))
    assert highest == [wait * (1 + RETRY_AFTER_JITTER) for wait in plain]
    drawn = list(itertools.islice(RetryForever(5.0), 200))[-100:]
    assert all(5.0 <= w <= 5.0 * (1 + RETRY_AFTER_JITTER) for w in drawn) and len({round(w, 1) for w in drawn}) > 5
