"""The backends' real upstream controllers on the session's cluster (atlas_cluster/controllers.py): JobSet, Kueue, the
Kubeflow Trainer and the training-operator, built from their modules, run as processes under their own
ServiceAccounts, their webhooks served on 127.0.0.1 and called by the real API server.

What each test shows: a webhook refuses a bad object with the upstream's own message (so the API server → webhook
path, its TLS and CA bundle work), and each controller does its first job: Kueue admits a queued Job, the
training-operator makes a PyTorchJob's pods and Services, JobSet makes its Jobs, the Trainer makes a JobSet from a
TrainJob. No node runs pods: they are created, and stay Pending.

The controllers run for this module only (its fixture stops them and removes their webhook configurations): the
session's other tests expect a cluster whose backends nobody reconciles.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from atlas_cluster.cluster import kubectl
from atlas_cluster.controllers import Running
from harness.env import python_env
from tests.kube.conftest import BIN_DIR, CONTROLLER_BINARIES, CONTROLLERS, Kube, eventually, upstream_controllers
from tests.kube.test_cluster_cli import process_alive

NAMES = CONTROLLERS
BINARIES = CONTROLLER_BINARIES
IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: no node runs pods here


@pytest.fixture(scope="module")
def controllers(kube: Kube) -> Iterator[dict[str, Running]]:
    with upstream_controllers(kube, NAMES) as running:
        yield running


def _refused(kube: Kube, namespace: str, manifest: dict) -> str:
    done = kube.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False)
    assert done.returncode != 0, f"created: {done.stdout}"
    return done.stderr


def _container(name: str) -> dict:
    return {"name": name, "image": IMAGE}


def _pytorchjob(name: str, masters: int) -> dict:
    def replica(count: int) -> dict:
        return {
            "replicas": count,
            "restartPolicy": "Never",
            "template": {"spec": {"containers": [_container("pytorch")]}},
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(masters), "Worker": replica(1)}},
    }


def _jobset(name: str, success_targets: list[str] | None = None) -> dict:
    spec: dict = {
        "replicatedJobs": [
            {
                "name": "workers",
                "replicas": 2,
                "template": {
                    "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [_container("w")]}}}
                },
            }
        ],
    }
    if success_targets is not None:
        spec["successPolicy"] = {"operator": "All", "targetReplicatedJobs": success_targets}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}, "spec": spec}


def _cluster_runtime(name: str, replicas: int = 1) -> dict:
    """A minimal torch ClusterTrainingRuntime (as upstream's torch-distributed): one ``node`` job, the trainer."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": replicas,
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {"template": {"spec": {"containers": [_container("node")]}}},
                            },
                        }
                    ]
                }
            },
        },
    }


# ---------------------------------------------------------------------- (a) each webhook refuses a bad object


def test_training_operator_webhook_refuses_two_masters(kube, controllers, namespace):
    message = _refused(kube, namespace, _pytorchjob("two-masters", masters=2))
    assert 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied' in message, message
    assert "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1" in message, message


def test_jobset_webhook_refuses_a_success_policy_naming_no_replicated_job(kube, controllers, namespace):
    message = _refused(kube, namespace, _jobset("bad", success_targets=["nope"]))
    assert "invalid replicatedJob name 'nope' does not appear in .spec.ReplicatedJobs" in message, message


def test_trainer_webhook_refuses_a_runtime_whose_trainer_job_has_two_replicas(kube, controllers, namespace):
    message = _refused(kube, namespace, _cluster_runtime(f"bad-{namespace}", replicas=2))
    assert 'admission webhook "validator.clustertrainingruntime.trainer.kubeflow.org" denied' in message, message
    assert "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 2: always must be 1" in message, message


def test_a_trainjob_naming_a_missing_runtime_is_refused(kube, controllers, namespace):
    """Two webhooks refuse it: the Trainer's and Kueue's (its TrainJob integration looks the runtime up too, queued
    or not); the API server calls validating webhooks in parallel and returns whichever refusal comes first."""
    missing = f"missing-{namespace}"
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "orphan"},
        "spec": {"runtimeRef": {"name": missing}},
    }
    message = _refused(kube, namespace, trainjob)
    trainer = (
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied',
        "specified clusterTrainingRuntime must be created before the TrainJob is created",
    )
    kueue = ('admission webhook "vtrainjob.kb.io" denied', f"runtime '{missing}' not found")
    assert all(part in message for part in trainer) or all(part in message for part in kueue), message


def test_kueue_webhook_refuses_a_negative_quota(kube, controllers, namespace):
    queue = _cluster_queue(f"bad-{namespace}", f"flavor-{namespace}", cpu="-1")
    message = _refused(kube, namespace, queue)
    assert 'admission webhook "vclusterqueue.kb.io" denied' in message, message
    assert "must be greater than or equal to 0" in message, message


# ---------------------------------------------------------------------- (b)-(e) each controller does its job


def _cluster_queue(name: str, flavor: str, cpu: str = "4") -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": "4Gi"},
                            ],
                        }
                    ],
                }
            ],
        },
    }


def test_kueue_admits_a_queued_job(kube, controllers, namespace):
    flavor, cluster_queue = f"flavor-{namespace}", f"cq-{namespace}"
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        _cluster_queue(cluster_queue, flavor),
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "queue", "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": "queue"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {**_container("main"), "resources": {"requests": {"cpu": "1", "memory": "100Mi"}}},
                    ],
                }
            }
        },
    }
    try:
        kube.kubectl("create", "-f", "-", input="\n".join(json.dumps(o) for o in objects))
        created = json.loads(
            kube.kubectl("create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(job)).stdout
        )
        # Kueue's mutating webhook suspends a queued Job as it is created; its scheduler admits the Workload and
        # the job controller unsuspends the Job.
        assert created["spec"]["suspend"] is True, created["spec"]
        eventually(
            "the Job unsuspended", lambda: kube.get("job", "queued", "-n", namespace)["spec"]["suspend"] is False
        )
        workloads = kube.get("workloads.kueue.x-k8s.io", "-n", namespace)["items"]
        assert len(workloads) == 1, workloads
        conditions = {c["type"]: c["status"] for c in workloads[0]["status"]["conditions"]}
        assert conditions.get("Admitted") == "True", conditions
    finally:
        kube.kubectl("delete", "job", "queued", "-n", namespace, "--ignore-not-found", "--wait=false", check=False)
        kube.kubectl("delete", "localqueue", "queue", "-n", namespace, "--ignore-not-found", check=False)
        kube.kubectl("delete", "clusterqueue", cluster_queue, "--ignore-not-found", "--wait=false", check=False)
        kube.kubectl("delete", "resourceflavor", flavor, "--ignore-not-found", "--wait=false", check=False)


def test_training_operator_creates_a_pytorchjobs_pods_and_services(kube, controllers, namespace):
    kube.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(_pytorchjob("torch", masters=1)))
    expected = {"torch-master-0", "torch-worker-0"}

    def names(kind: str) -> set[str]:
        return {item["metadata"]["name"] for item in kube.get(kind, "-n", namespace)["items"]}

    eventually("the PyTorchJob's pods", lambda: names("pods") >= expected)
    eventually("the PyTorchJob's Services", lambda: names("services") >= expected)
    pod = kube.get("pod", "torch-worker-0", "-n", namespace)
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    assert pod["status"].get("phase") == "Pending"  # no node runs it
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    assert env.get("MASTER_ADDR") == "torch-master-0" and env.get("WORLD_SIZE") == "2", env


def test_jobset_creates_its_jobs(kube, controllers, namespace):
    kube.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(_jobset("set")))
    jobs = eventually(
        "the JobSet's Jobs",
        lambda: (
            {j["metadata"]["name"] for j in kube.get("jobs", "-n", namespace)["items"]}
            >= {"set-workers-0", "set-workers-1"}
        ),
    )
    assert jobs


def test_trainer_creates_a_jobset_from_a_trainjob(kube, controllers, namespace):
    runtime = f"torch-{namespace}"
    cluster_runtime = _cluster_runtime(runtime)
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "train"},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 2}},
    }
    try:
        kube.kubectl("create", "-f", "-", input=json.dumps(cluster_runtime))
        kube.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(trainjob))
        jobset = eventually(
            "the TrainJob's JobSet",
            lambda: next(iter(kube.get("jobsets", "-n", namespace)["items"]), None),
        )
        assert jobset["metadata"]["name"] == "train"
        assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
        node = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "node")
        assert node["template"]["spec"]["parallelism"] == 2, node  # the TrainJob's numNodes, applied by the Trainer
        # And the JobSet controller makes its Job from it.
        eventually("the JobSet's Job", lambda: kube.get("jobs", "-n", namespace)["items"])
    finally:
        kube.kubectl("delete", "trainjob", "train", "-n", namespace, "--ignore-not-found", "--wait=false", check=False)
        kube.kubectl("delete", "clustertrainingruntime", runtime, "--ignore-not-found", "--wait=false", check=False)


# ---------------------------------------------------------------------- atlas cluster up --controllers


def test_cluster_up_with_controllers_runs_them_and_down_stops_them(kube, controllers, tmp_path):
    """A cluster of its own (its folder, ports, processes), JobSet only (the quickest start) and no operator."""
    cache = tmp_path / "cache"
    (cache / "kube").mkdir(parents=True)
    # The built controllers, from this machine's cache (the rest of the cache is the test's own).
    (cache / "kube" / "controllers").symlink_to(BINARIES["jobset"].parents[2])
    env = python_env(ATLAS_CACHE_DIR=str(cache), ATLAS_KUBE_BIN=str(BIN_DIR))

    def atlas(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "atlas_cli.main", "cluster", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    unknown = atlas("up", "--name", "ctl", "--controllers", "jobset,nope")
    assert unknown.returncode == 2 and "unknown controller nope: choose from jobset, kueue" in unknown.stderr
    pids_file = cache / "kube/clusters/ctl/pids.json"
    up = atlas("up", "--name", "ctl", "--no-operator", "--controllers", "jobset")
    try:
        pids = {name: entry["pid"] for name, entry in json.loads(pids_file.read_text()).items()}
        assert up.returncode == 0, up.stderr
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "jobset"}, pids
        assert "jobset v0.12.0 ready" in up.stderr and "system:serviceaccount:jobset-system:" in up.stderr
        kubeconfig = cache / "kube/clusters/ctl/admin.kubeconfig"
        refused = kubectl(kubeconfig, "create", "-f", "-", input=json.dumps(_jobset("bad", ["nope"])), check=False)
        assert "invalid replicatedJob name 'nope'" in refused.stderr, refused.stderr
    finally:
        down = atlas("down", "--name", "ctl")
    assert down.returncode == 0, down.stderr
    assert [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists() and process_alive(pid)] == []


def test_no_controller_request_was_refused_by_its_upstream_rbac(kube, controllers):
    """Each controller ran under its own ServiceAccount with its upstream ClusterRole: the audit log (every
    ServiceAccount's request) shows none of theirs refused — runs last, after each did its work above."""
    accounts = {
        f"system:serviceaccount:{doc['metadata']['namespace']}:{doc['metadata']['name']}"
        for running in controllers.values()
        for doc in yaml.safe_load_all((running.directory / "rbac.yaml").read_text())
        if doc and doc["kind"] == "ServiceAccount"
    }
    assert len(accounts) == len(NAMES), accounts
    seen, refused = set(), []
    for event in kube.cluster.control_plane.audit_events():
        user = event["user"]["username"]
        if user in accounts:
            seen.add(user)
            # The authorizer's own verdict: a 403 of admission (a namespace being deleted) is no RBAC refusal.
            if (event.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid":
                ref = event.get("objectRef", {})
                refused.append((user, event["verb"], ref.get("resource"), ref.get("namespace")))
    assert seen == accounts, f"no request of {accounts - seen}"
    assert refused == [], refused
