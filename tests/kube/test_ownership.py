"""Ownership and garbage collection on a real API server, with the real garbage collector (tests/kube/conftest.py).

What tests/emulator/test_operator_ownership.py shows on the API emulator, here against kube-apiserver and
kube-controller-manager: objects someone else made under a run's child names (none of their ownerReferences a
controller reference to the run) stay as they were, resourceVersion and all, through the run's life and its deletion,
background or foreground; the run says which (ChildrenReady=False, NameConflict); a deleted run's children are
collected by the garbage collector itself, through the ownerReferences the operator wrote; and an operator started
over what release 0.1.0 made (tests/fixtures/upgrade/) writes nothing to a running job or server.

The operator's requests are read from the API server's audit log (every request of a ServiceAccount), not from its
own log: what it did not send, the server did not get.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import pytest
from atlas_operator import kube as k8s
from atlas_operator.kube import Kube, Resource
from atlas_operator.ticker import tick_line

from harness.manifests import training
from harness.polling import wait_for
from tests.kube.conftest import Release, start_release, stop_release
from tests.support import upgrade_fixtures

pytestmark = pytest.mark.timeout(300)
GROUP, VERSION = "atlas.arc.computer", "v1alpha1"
RUNS = {
    "AtlasTraining": Resource(GROUP, VERSION, "atlastrainings", "AtlasTraining"),
    "AtlasTeacher": Resource(GROUP, VERSION, "atlasteachers", "AtlasTeacher"),
}
TIMEOUT = 60  # the operator's reactions (its timer ticks every second here)
# The garbage collector learns of the CRDs' resources at its discovery resync (every 30 s): a run deleted in the
# first half-minute of the control plane is collected after that.
GC_TIMEOUT = 90
WRITES = ("create", "update", "patch", "delete", "deletecollection")
TEST_AGENT = "atlas-kube-tests"


def chart_values(*watched: str) -> dict:
    """The chart for one namespace's operator: namespaced RBAC (namespace listing granted: no wait at start), and a
    ClusterTrainingRuntime of the release's own (the chart's fixed name would collide between two releases)."""
    return {
        "rbac": {"scope": "namespaced"},
        "watchNamespaces": list(watched),
        "trainJob": {"runtime": {"name": f"atlas-grpo-{watched[0]}"}},
    }


# --------------------------------------------------------------------------- a namespace, as the admin sees it


@dataclass
class Cluster:
    """The admin's view of one namespace, and the operator's requests in the audit log."""

    kube: Any  # tests.kube.conftest.Kube
    namespace: str
    release: Release | None = None
    client: Kube = field(init=False)

    def __post_init__(self) -> None:
        api = self.kube.api()
        self.client = Kube(api)
        api.user_agent = TEST_AGENT  # Kube() set the operator's
        self.api = api
        self.custom = kubernetes.client.CustomObjectsApi(api)

    # runs
    def create_run(self, manifest: dict) -> dict:
        manifest = copy.deepcopy(manifest)
        manifest["metadata"]["namespace"] = self.namespace
        return self.client.request("POST", RUNS[manifest["kind"]].path(self.namespace), manifest)

    def run(self, manifest: dict) -> dict | None:
        return self.client.get_fresh(RUNS[manifest["kind"]], self.namespace, manifest["metadata"]["name"])

    def status(self, manifest: dict) -> dict:
        return (self.run(manifest) or {}).get("status") or {}

    def condition(self, manifest: dict, type_: str) -> dict:
        return next((c for c in self.status(manifest).get("conditions") or [] if c["type"] == type_), {})

    def wait_status(self, manifest: dict, predicate: Callable[[dict], Any], what: str, timeout=TIMEOUT) -> dict:
        try:
            wait_for(lambda: predicate(self.status(manifest)), timeout=timeout, interval=0.1, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; status: {json.dumps(self.status(manifest))[:3000]}") from None
        return self.status(manifest)

    def patch_run(self, manifest: dict, patch: dict, subresource: str | None = None) -> dict:
        resource = RUNS[manifest["kind"]]
        return self.client.patch(resource, self.namespace, manifest["metadata"]["name"], patch, subresource)

    def delete_run(self, manifest: dict, policy: str = "Background") -> None:
        path = RUNS[manifest["kind"]].path(self.namespace, manifest["metadata"]["name"])
        self.client.request("DELETE", path, {"propagationPolicy": policy})

    # any object
    def get(self, resource: Resource, name: str) -> dict | None:
        return self.client.get_fresh(resource, self.namespace, name)

    def create(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj["metadata"]["namespace"] = self.namespace
        return self.client.create(obj)

    def events(self, name: str, reason: str) -> list[dict]:
        items = self.client.request("GET", k8s.EVENT.path(self.namespace)).get("items") or []
        return [e for e in items if e["involvedObject"].get("name") == name and e["reason"] == reason]

    # the operator's requests
    def audit_mark(self) -> int:
        return self.kube.cluster.control_plane.audit_mark()

    def operator_requests(self, since: int = 0) -> list[dict]:
        """The audit log's entries of the operator's ServiceAccount (its client and kopf) from byte ``since``."""
        assert self.release is not None
        user = f"system:serviceaccount:{self.release.namespace}:"
        events = self.kube.cluster.control_plane.audit_events(since)
        return [entry for entry in events if entry["user"]["username"].startswith(user)]

    def operator_writes(self, since: int = 0, names: set[str] | None = None, runs: bool = True) -> list[str]:
        """The operator's writes the API server accepted (``runs=False``: but those to the runs themselves), as "verb
        resource/name". A create refused AlreadyExists changed nothing: it is how a new run, which creates first as
        Go controllers do, finds a name taken (atlas_operator/reconcile/children.py)."""
        return [
            f"{e['verb']} {ref.get('resource')}/{ref.get('name')}"
            + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            for e in self.operator_requests(since)
            if e["verb"] in WRITES
            and (e.get("responseStatus") or {}).get("code", 200) < 400
            and (ref := e.get("objectRef") or {})
            and (names is None or ref.get("name") in names)
            and ref.get("resource") != "events"
            and (runs or ref.get("resource") not in ("atlastrainings", "atlasteachers"))
        ]

    def operator_reads(self, resource: str, name: str, since: int = 0) -> int:
        return sum(
            1
            for e in self.operator_requests(since)
            if e["verb"] == "get"
            and (e.get("objectRef") or {}).get("resource") == resource
            and e["objectRef"].get("name") == name
        )


@contextlib.contextmanager
def shared_namespace(kube, prefix: str) -> Iterator[Cluster]:
    """A namespace and one operator (its own chart release) that a module's cases share, each with names of its own."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    cluster = Cluster(kube, namespace)
    cluster.release = start_release(kube, namespace, chart_values(namespace))
    try:
        yield cluster
    finally:
        stop_release(kube, cluster.release)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def shared(kube):
    """One namespace and one operator for the module's cases (each uses names of its own)."""
    with shared_namespace(kube, "own") as cluster:
        yield cluster


# --------------------------------------------------------------------------- upgrades
# (first: the garbage collector, which the later cases wait for, may not follow the CRDs' resources yet)


UPGRADED_SETTINGS = {
    "ATLAS_TRAINER_IMAGE": "registry.example/atlas-trainer:9.9.9",
    "ATLAS_ROLLOUT_IMAGE": "registry.example/atlas-vllm:9.9.9",
    "ATLAS_MONITORING_NAMESPACE": "observability",
}
WORKLOADS = {"pytorchjobs", "jobsets", "deployments", "configmaps"}


def test_upgraded_operator_writes_no_workload(kube, namespace, operator_release):
    """Release 0.1.0's runs and children (tests/fixtures/upgrade/, recorded in namespace default), loaded into the
    real server as an earlier renderer made them; the current operator, with other settings, started over them:
    no write to a job, a server Deployment or a ConfigMap, while each job's status still reaches its run."""
    from tests.emulator.test_operator_ownership import rendered_by_an_earlier_release

    version = sorted(p.name for p in upgrade_fixtures.FIXTURES.iterdir())[-1]
    api = kube.api()
    runs = upgrade_fixtures.load(api, version, change=rendered_by_an_earlier_release)
    cluster = Cluster(kube, "default")
    try:
        made = {}
        for run in runs:
            body = cluster.run(run)
            for resource, child in children_of(body["status"]):
                made[(resource, child)] = cluster.get(resource, child)
        for resource, child in list(made):
            if resource is k8s.DEPLOYMENT:
                made[(resource, child)] = wait_for(
                    lambda c=child, o=made[(resource, child)]: deployment_settled(cluster, c, o["spec"]["replicas"]),
                    timeout=TIMEOUT,
                    what=f"Deployment {child} settled",
                )
        assert all(cluster.run(r)["metadata"].get("finalizers") == [f"{GROUP}/cleanup"] for r in runs)  # 0.1.0's
        release = operator_release(chart_values("default"), env=UPGRADED_SETTINGS)
        cluster.release = release
        loader = upgrade_fixtures.Loader(kube.api())
        jobs = {
            (r["metadata"]["name"], "JobSet" if r["status"]["children"].get("jobSet") else "PyTorchJob") for r in runs
        }
        for round_ in (1, 2):  # each job's new state reaches its run, round after round
            for name, kind in jobs:
                loader.patch_status(kind, "default", name, upgrade_fixtures.running_status(kind, round_))
            for run in runs:
                wait_for(
                    lambda r=run, n=round_: _refreshed(cluster, r, n),
                    timeout=TIMEOUT,
                    what=f"{run['metadata']['name']} round {round_}",
                )
        for run in runs:  # and each run's timer went by a few times
            name = run["metadata"]["name"]
            timer = tick_line("default", name)
            wait_for(lambda t=timer: release.operator_log.read_text().count(t) >= 3, timeout=TIMEOUT, what=timer)
        writes = [w for w in cluster.operator_writes() if w.split()[1].split("/")[0] in WORKLOADS]
        assert writes == []
        for (resource, child), before in made.items():
            now = cluster.get(resource, child)
            if resource is k8s.DEPLOYMENT or resource in k8s.JOBS.values():  # their status: their controller's
                now, before = _without_status(now), _without_status(before)
                for obj in (now, before):
                    del obj["metadata"]["resourceVersion"], obj["metadata"]["managedFields"]
            if resource in (k8s.SERVICE, k8s.NETWORK_POLICY):  # not pinned: these follow the current rendering
                if child.endswith("-metrics"):  # 0.1.0's had a ClusterIP (immutable): made again, headless
                    assert before["spec"]["clusterIP"] != "None" and now["spec"]["clusterIP"] == "None", child
                continue
            assert now == before, f"{resource.kind} {child} changed"
        for run in runs:
            status = cluster.run(run)["status"]
            assert status["phase"] == "Running"
            applied = next(c for c in status["conditions"] if c["type"] == "SpecApplied")
            assert applied["status"] == "True", applied
        for run in runs:  # this operator puts no finalizer, and kopf took off the one 0.1.0's put on: deleted at once
            assert not cluster.run(run)["metadata"].get("finalizers"), run["metadata"]["name"]
            cluster.delete_run(run)
        for run in runs:
            wait_for(lambda r=run: cluster.run(r) is None, timeout=TIMEOUT, what=f"{run['metadata']['name']} gone")
    finally:
        _remove_fixtures(cluster, runs)


def _without_status(obj: dict) -> dict:
    return {key: value for key, value in obj.items() if key != "status"}


def _refreshed(cluster: Cluster, run: dict, round_: int) -> bool:
    status = cluster.status(run)
    if run["status"]["children"].get("jobSet"):
        return status.get("restarts") == round_
    training_condition = next((c for c in status.get("conditions") or [] if c["type"] == "Training"), {})
    return training_condition.get("message") == f"PyTorchJob is running (round {round_})"


def _remove_fixtures(cluster: Cluster, runs: list[dict]) -> None:
    """Namespace default outlives the test: its runs go (their children with them, by the garbage collector)."""
    for run in runs:
        try:
            cluster.delete_run(run)
            cluster.patch_run(run, {"metadata": {"finalizers": None}})
        except k8s.ApiError:
            pass
    for obj in upgrade_fixtures.PREREQUISITES:
        try:
            cluster.client.request("DELETE", k8s.PVC.path("default", obj["metadata"]["name"]))
        except k8s.ApiError:
            pass


# --------------------------------------------------------------------------- objects someone else made

CONTAINER = {"name": "train", "image": "other-team/train:1"}
PYTORCHJOB_DONE = {
    "conditions": [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created"},
        {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done"},
    ],
    "replicaStatuses": {"Master": {"succeeded": 1}},
}


def someone_elses_job(backend: str, name: str, runtime: str) -> tuple[dict, dict | None]:
    """Another team's job of the run's backend under the run's name, and its finished status (None: none)."""
    meta = {"name": name}
    if backend == "PyTorchJob":
        spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {"containers": [CONTAINER]}}}}}
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": spec}, PYTORCHJOB_DONE
    if backend == "JobSet":
        job = {"template": {"spec": {"template": {"spec": {"containers": [CONTAINER], "restartPolicy": "Never"}}}}}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        done = {
            "type": "Completed",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "done",
            "lastTransitionTime": now,
        }
        return (
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": meta,
                "spec": {"replicatedJobs": [{"name": "main", **job}]},
            },
            {"terminalState": "Completed", "conditions": [done]},
        )
    spec = {"runtimeRef": {"name": runtime}, "suspend": True}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": meta, "spec": spec}, None


def deployment_settled(cluster: Cluster, name: str, replicas: int = 0) -> dict | None:
    """The Deployment once the deployment controller has written its status for its generation and made its
    ReplicaSet's pods (which never start: no node); of 0 replicas, once it says so (it writes no more after that)."""
    obj = cluster.get(k8s.DEPLOYMENT, name)
    status = (obj or {}).get("status") or {}
    progressing = next((c for c in status.get("conditions") or [] if c["type"] == "Progressing"), {})
    wanted = "NewReplicaSetAvailable" if replicas == 0 else "ReplicaSetUpdated"
    if (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and status.get("updatedReplicas", 0) == replicas
        and progressing.get("reason") == wanted
    ):
        return obj
    return None


@pytest.mark.parametrize(
    "backend,policy",
    [("PyTorchJob", "Background"), ("PyTorchJob", "Foreground"), ("JobSet", "Foreground"), ("TrainJob", "Background")],
)
def test_objects_someone_else_made_stay_as_they_are_through_the_runs_life_and_deletion(shared, backend, policy):
    cluster = shared
    name = f"theirs-{backend.lower()}-{policy.lower()}"
    runtime = chart_values(cluster.namespace)["trainJob"]["runtime"]["name"]
    # Before the run: a ConfigMap with nobody as controller, another team's finished job, a NetworkPolicy controlled
    # by another object, and (where the run has server Deployments) someone's Deployment.
    owner = cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-owner"}})
    owner_ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    theirs = {
        (k8s.CONFIG_MAP, f"{name}-config"): {"data": {"settings.ini": "[web]\nport = 8080\n"}},
        (k8s.NETWORK_POLICY, f"{name}-network"): {
            "metadata": {"ownerReferences": [owner_ref]},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]},
        },
    }
    job, job_status = someone_elses_job(backend, name, runtime)
    theirs[(k8s.JOBS[backend], name)] = job
    if backend != "JobSet":  # a JobSet run's servers are in its JobSet
        labels = {"app": "their-web"}
        theirs[(k8s.DEPLOYMENT, f"{name}-rollout")] = {
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [CONTAINER]}},
            }
        }
    for (resource, child), body in theirs.items():
        meta = {**body.get("metadata", {}), "name": child}
        cluster.create({"apiVersion": _api_version(resource), "kind": resource.kind, **body, "metadata": meta})
    if job_status:
        cluster.client.patch(k8s.JOBS[backend], cluster.namespace, name, {"status": job_status}, "status")

    manifest = training(name, backend=backend)
    run = cluster.create_run(manifest)
    message = _conflict(cluster, manifest)["message"]
    assert f"ConfigMap {name}-config (no controller: made by someone else)" in message
    # Made now the run exists: a Service with a (non-controller) owner reference to the run.
    metrics = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-metrics",
            "labels": {"app": "web"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "AtlasTraining",
                    "name": name,
                    "uid": run["metadata"]["uid"],
                }
            ],
        },
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    cluster.create(metrics)
    theirs[(k8s.SERVICE, f"{name}-metrics")] = metrics
    named = [
        f"ConfigMap {name}-config (no controller: made by someone else)",
        f"Service {name}-metrics (no controller: made by someone else)",
        f"NetworkPolicy {name}-network (controlled by ConfigMap {name}-owner (uid {owner['metadata']['uid']}))",
        f"{backend} {name} (no controller: made by someone else)",
    ]
    if backend != "JobSet":
        named.append(f"Deployment {name}-rollout (no controller: made by someone else)")
        wait_for(lambda: deployment_settled(cluster, f"{name}-rollout"), timeout=TIMEOUT, what="their Deployment")
    cluster.wait_status(
        manifest,
        lambda s: all(n in cluster.condition(manifest, "ChildrenReady").get("message", "") for n in named),
        f"NameConflict naming {named}",
    )
    before = {key: cluster.get(*key) for key in theirs}
    mark = cluster.audit_mark()
    # The run's timer looks again (each pass reads the names from the API server), and still does nothing.
    wait_for(lambda: cluster.operator_reads("configmaps", f"{name}-config", mark) >= 3, timeout=TIMEOUT, what="retries")
    assert {key: cluster.get(*key) for key in theirs} == before  # the whole object: resourceVersion, uid, all
    names = {child for _, child in theirs}
    assert cluster.operator_writes(0, names, runs=False) == []  # (the run itself aside: its finalizer and status)
    for resource, child in [
        (k8s.NETWORK_POLICY, f"{name}-network-trainer"),
        (k8s.SERVICE, f"{name}-rollout"),
        (k8s.DEPLOYMENT, f"{name}-rollout"),
    ]:
        if (resource, child) not in theirs:
            assert cluster.get(resource, child) is None, f"{resource.kind} {child} made while names are taken"
    status = cluster.status(manifest)
    assert status["phase"] == "Pending" and not status.get("children")
    # One Warning per conflict the run reported (two: before and after the Service came), none repeated per pass.
    warnings = cluster.events(name, "NameConflict")
    assert [e["type"] for e in warnings] == ["Warning", "Warning"], warnings
    assert len({e["message"] for e in warnings}) == 2

    mark = cluster.audit_mark()
    cluster.delete_run(manifest, policy)
    wait_for(lambda: cluster.run(manifest) is None, timeout=TIMEOUT, what=f"the run deleted ({policy})")
    # The garbage collector collects the Service whose only owner was the run (a non-controller owner reference
    # is still an owner): Kubernetes', not the operator's doing.
    wait_for(lambda: cluster.get(k8s.SERVICE, f"{name}-metrics") is None, timeout=GC_TIMEOUT, what="GC")
    del before[(k8s.SERVICE, f"{name}-metrics")]
    assert {key: cluster.get(*key) for key in before} == before
    assert cluster.operator_writes(mark, names, runs=False) == []
    assert cluster.get(k8s.CONFIG_MAP, f"{name}-owner")["metadata"]["uid"] == owner["metadata"]["uid"]


def _api_version(resource: Resource) -> str:
    return f"{resource.group}/{resource.version}" if resource.group else resource.version


def _conflict(cluster: Cluster, manifest: dict) -> dict:
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "ChildrenReady").get("reason") == "NameConflict",
        "ChildrenReady=False NameConflict",
    )
    condition = cluster.condition(manifest, "ChildrenReady")
    assert condition["status"] == "False"
    return condition


# --------------------------------------------------------------------------- the garbage collector


def children_of(status: dict) -> list[tuple[Resource, str]]:
    kinds = {
        "pytorchJob": [k8s.PYTORCH_JOB],
        "jobSet": [k8s.JOBSET],
        "trainJob": [k8s.TRAINJOB],
        "rollout": [k8s.SERVICE, k8s.DEPLOYMENT],
        "student": [k8s.SERVICE, k8s.DEPLOYMENT],
        "configMap": [k8s.CONFIG_MAP],
        "metricsService": [k8s.SERVICE],
        "networkPolicy": [k8s.NETWORK_POLICY],
        "trainerNetworkPolicy": [k8s.NETWORK_POLICY],
    }
    return [(resource, name) for key, name in status["children"].items() for resource in kinds[key]]


def test_gc_collects_a_deleted_runs_children(kube, namespace, operator_release):
    """Every backend's children carry ownerReferences the real garbage collector follows, and the runs no finalizer:
    with the operator stopped, deleting the runs deletes every child (the operator deletes none at any time)."""
    release = operator_release(chart_values(namespace))
    cluster = Cluster(kube, namespace, release)
    manifests = [
        training("gc-pytorchjob", backend="PyTorchJob"),
        training("gc-jobset", backend="JobSet"),
        {**training("gc-trainjob", backend="TrainJob"), "kind": "AtlasTeacher"},
    ]
    manifests[2]["spec"]["student"] = {"model": "meta-llama/Llama-3.2-1B-Instruct", "rollout": {"replicas": 1}}
    runs = {m["metadata"]["name"]: cluster.create_run(m) for m in manifests}
    children = {}
    for manifest in manifests:
        status = cluster.wait_status(manifest, lambda s: s.get("children") and s.get("observedGeneration"), "children")
        name = manifest["metadata"]["name"]
        children[name] = children_of(status)
        for resource, child in children[name]:
            obj = wait_for(lambda r=resource, c=child: cluster.get(r, c), timeout=TIMEOUT, what=f"{child}")
            (ref,) = obj["metadata"]["ownerReferences"]
            assert ref == {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": manifest["kind"],
                "name": name,
                "uid": runs[name]["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
    assert {name: len(c) for name, c in children.items()} == {"gc-pytorchjob": 7, "gc-jobset": 5, "gc-trainjob": 9}
    kube.cluster.supervisor.stop(f"operator-{release.name}")  # nothing of the operator's from here on
    mark = cluster.audit_mark()
    for manifest in manifests:
        assert not cluster.run(manifest)["metadata"].get("finalizers")  # nothing holds the deletion
        cluster.delete_run(manifest)
    for manifest in manifests:
        wait_for(lambda m=manifest: cluster.run(m) is None, timeout=TIMEOUT, what="the run gone")
    left = lambda: [f"{r.kind} {c}" for cs in children.values() for r, c in cs if cluster.get(r, c)]  # noqa: E731
    wait_for(lambda: not left(), timeout=GC_TIMEOUT, what="every child collected")
    assert cluster.operator_requests(mark) == []


def test_foreground_deletion_waits_for_the_runs_children(shared):
    """Children block their run's foreground deletion (blockOwnerDeletion): the run is gone only after them."""
    cluster = shared
    manifest = training("fg-run")
    cluster.create_run(manifest)
    status = cluster.wait_status(manifest, lambda s: s.get("children") and s.get("observedGeneration"), "children")
    children = children_of(status)
    wait_for(lambda: all(cluster.get(r, c) for r, c in children), timeout=TIMEOUT, what="children")
    cluster.delete_run(manifest, "Foreground")
    run = cluster.run(manifest)
    assert run is None or "foregroundDeletion" in run["metadata"]["finalizers"]
    seen_without_children = []

    def gone() -> bool:
        now = cluster.run(manifest)
        remaining = [c for r, c in children if cluster.get(r, c)]
        if now is not None and not remaining:
            seen_without_children.append(now["metadata"].get("finalizers"))
        return now is None and not remaining

    wait_for(gone, timeout=GC_TIMEOUT, what="run and children gone")
    # Whenever the run was seen with no child left, only the garbage collector's finalizer was holding it.
    assert all(f is None or set(f) <= {"foregroundDeletion"} for f in seen_without_children)


# --------------------------------------------------------------------------- a new run's requests


def test_a_new_runs_way_reads_nothing_and_writes_its_children_and_status(shared):
    """A new run's success path, as the API server's audit log records every request of the operator's in the
    namespace: its 7 children created, each once, without a look at their names first (Go controllers create first;
    a name taken is found by the create's AlreadyExists: the cases above), then its one status write, and nothing
    else: no finalizer, no Event (nothing to warn of), no read. The checkpoint PVC the runs share is read once, by the
    first run (a prerequisite found is trusted for a while): the second run's way is 8 requests, all writes."""
    cluster = shared
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "lean-ckpt"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.client.request("POST", k8s.PVC.path(cluster.namespace), pvc)

    def way(name: str) -> list[tuple[str, str, str, int]]:
        """(verb, resource, name/subresource, code) of the operator's requests in the namespace from the run's
        creation to its status write (the audit log writes a line after its answer: waited for)."""
        mark = cluster.audit_mark()
        cluster.create_run(training(name, checkpoint={"pvc": "lean-ckpt"}))
        status = ("patch", "atlastrainings", f"{name}/status", 200)

        def requests() -> list[tuple[str, str, str, int]]:
            found = []
            for entry in cluster.operator_requests(mark):
                ref = entry.get("objectRef") or {}
                named = str(ref.get("name") or "")
                # Its own objects, the PVC, and any Event (its name is generated): not the other tests' runs'.
                ours = named.startswith(name) or ref.get("resource") in ("persistentvolumeclaims", "events")
                if ref.get("namespace") != cluster.namespace or not ours or entry["verb"] in ("list", "watch"):
                    continue  # (the informer's listings and watches, opened as the operator starts: no run's)
                where = named + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                code = (entry.get("responseStatus") or {}).get("code")
                found.append((entry["verb"], ref.get("resource"), where, code))
            return found

        wait_for(lambda: status in requests(), timeout=TIMEOUT, what="the status write")
        seen = requests()
        return seen[: seen.index(status) + 1]

    first = way("lean-first")
    assert [r for r in first if r[0] != "create"][:-1] == [("get", "persistentvolumeclaims", "lean-ckpt", 200)], first
    second = way("lean-second")
    created = sorted((resource, where) for verb, resource, where, code in second if verb == "create" and code == 201)
    assert len(created) == 7 and len(set(created)) == 7, second
    assert all(where.startswith("lean-second") for _, where in created), second
    assert len(second) == 8 and second[-1] == ("patch", "atlastrainings", "lean-second/status", 200), second
    assert not cluster.events("lean-second", "Pending")
