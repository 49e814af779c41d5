"""The chart's RBAC against the real authorizer: the operator runs under its release's ServiceAccount on a real API
server (tests/kube/conftest.py), and every request it makes is judged there. What was refused is read from the API
server's audit log (a line per request of a ServiceAccount, with its response code), not from the operator's log.

- every chart configuration (rbac.scope cluster / namespaced, with and without watchNamespaces) serves its first
  run at once and is never refused anything;
- a run's whole life on each backend (PyTorchJob, JobSet, TrainJob) is never refused anything;
- the ServiceAccount cannot read Secrets and holds no wildcard;
- a rule taken out of files/rbac-rules.yaml shows: the 403 in the audit log, and the run's condition naming it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from atlas_contract.results import result_message
from harness.manifests import GROUP, VERSION, training
from harness.polling import wait_for
from tests.support.jobset_world import COMPLETION_INDEX, JOBSET_KEY, condition

TIMEOUT = 30
FIRST_RUN_S = 10.0  # a first run's children, from its create (the operator just started); the namespace-list 403s
# of kopf serving named namespaces without Namespace access made it ~55 s
PLURALS = {"AtlasTraining": "atlastrainings", "AtlasTeacher": "atlasteachers"}
JOBS = {  # backend: (group, version, plural)
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}


# --------------------------------------------------------------------------------------------------- helpers


def chart_values(namespace: str, scope: str = "cluster", watch: list[str] | None = None) -> dict[str, Any]:
    """The chart's values for a release in ``namespace``: its ClusterTrainingRuntime named after it (a cluster-scoped
    object: two releases of one name would fight over it)."""
    values: dict[str, Any] = {"rbac": {"scope": scope}, "trainJob": {"runtime": {"name": f"atlas-grpo-{namespace}"}}}
    if watch:
        values["watchNamespaces"] = watch
    return values


def service_account(kube, release) -> str:
    deployment = kube.cluster.operator_deployment(release.name, release.namespace)
    return deployment["spec"]["template"]["spec"]["serviceAccountName"]


def audit(kube, release) -> list[dict[str, Any]]:
    """Every request the release's ServiceAccount made, from the API server's audit log."""
    user = f"system:serviceaccount:{release.namespace}:{service_account(kube, release)}"
    return [e for e in kube.cluster.control_plane.audit_events() if e.get("user", {}).get("username") == user]


def refused(kube, release) -> list[str]:
    """The operator's requests the RBAC authorizer refused (the API server answered 403), as
    ``verb resource namespace/name``. A 403 of admission — a create in another test's namespace being deleted, which
    an operator serving every namespace may try — is not the authorizer's."""
    return sorted(
        {
            f"{e['verb']} {ref.get('apiGroup') or 'core'}/{ref.get('resource')}"
            f"{'/' + ref['subresource'] if ref.get('subresource') else ''} "
            f"{ref.get('namespace') or '-'}/{ref.get('name') or '*'}"
            for e in audit(kube, release)
            if (e.get("responseStatus") or {}).get("code") == 403
            and (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"
            for ref in [e.get("objectRef") or {}]
        }
    )


def custom(kube) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(kube.api())


def create_run(kube, manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    manifest["metadata"]["namespace"] = namespace
    return custom(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[manifest["kind"]], manifest)


def get_object(kube, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return custom(kube).get_namespaced_custom_object(group, version, namespace, plural, name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def run_of(kube, manifest: dict[str, Any]) -> dict[str, Any] | None:
    meta = manifest["metadata"]
    return get_object(kube, GROUP, VERSION, PLURALS[manifest["kind"]], meta["namespace"], meta["name"])


def wait_status(kube, manifest: dict[str, Any], check, what: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    return wait_for(
        lambda: (run := run_of(kube, manifest)) is not None and check(run.get("status") or {}) and run["status"],
        timeout=timeout,
        what=what,
    )


def job_of(kube, backend: str, namespace: str, name: str) -> dict[str, Any] | None:
    return get_object(kube, *JOBS[backend], namespace, name)


def config_map(kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kubernetes.client.CoreV1Api(kube.api()).read_namespaced_config_map(name, namespace).to_dict()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_spec(kube, manifest: dict[str, Any], spec: dict[str, Any]) -> None:
    meta = manifest["metadata"]
    custom(kube).patch_namespaced_custom_object(
        GROUP, VERSION, meta["namespace"], PLURALS[manifest["kind"]], meta["name"], {"spec": spec}
    )


def delete_run(kube, manifest: dict[str, Any]) -> None:
    meta = manifest["metadata"]
    custom(kube).delete_namespaced_custom_object(
        GROUP, VERSION, meta["namespace"], PLURALS[manifest["kind"]], meta["name"]
    )
    wait_for(lambda: run_of(kube, manifest) is None, timeout=TIMEOUT, what="the run deleted (its finalizer removed)")


def small_run(name: str, backend: str = "PyTorchJob") -> dict[str, Any]:
    """An AtlasTraining with one rollout server (so a Deployment and a Service too), on ``backend``."""
    return training(name, backend=backend, resources={"nodes": 1, "gpusPerNode": 1})


@pytest.fixture
def other_namespace(kube, namespace) -> Iterator[str]:
    """A second namespace, for a release that watches somewhere else than where it is installed."""
    name = f"{namespace}-w"[:63]
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


# ------------------------------------------------------------------------------------- 1. every configuration

CONFIGURATIONS = {  # id: (rbac.scope, watchNamespaces set)
    "cluster-all": ("cluster", False),
    "cluster-watch": ("cluster", True),
    "namespaced-release": ("namespaced", False),
    "namespaced-watch": ("namespaced", True),
}


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_first_run(kube, namespace, other_namespace, operator_release, configuration):
    """Each chart configuration serves its first run at once (children within FIRST_RUN_S of the operator's start)
    and the API server refuses the operator nothing."""
    scope, watching = CONFIGURATIONS[configuration]
    release = operator_release(chart_values(namespace, scope, [other_namespace] if watching else None))
    started = time.monotonic()
    runs_in = other_namespace if watching else namespace
    manifest = small_run("first-run")
    create_run(kube, manifest, runs_in)
    wait_for(lambda: config_map(kube, runs_in, "first-run-config"), timeout=60, what="the first run's ConfigMap")
    wait_for(lambda: job_of(kube, "PyTorchJob", runs_in, "first-run"), timeout=TIMEOUT, what="its PyTorchJob")
    children_s = time.monotonic() - started
    status = wait_status(kube, manifest, lambda s: s.get("phase") == "Pending", "the run's phase")
    print(f"{configuration}: first run's children {children_s:.1f} s after the operator's start")
    ready = next(c for c in status["conditions"] if c["type"] == "ChildrenReady")
    assert ready["status"] == "True", ready
    assert children_s < FIRST_RUN_S, f"the first run waited {children_s:.1f} s for its children"
    # The operator did serve where it should: its requests went to the watched namespace.
    assert any(
        e["verb"] == "create" and (e.get("objectRef") or {}).get("namespace") == runs_in for e in audit(kube, release)
    )
    delete_run(kube, manifest)
    assert refused(kube, release) == []
    log = release.operator_log.read_text()
    assert "Not enough permissions" not in log and "cannot watch" not in log


# ------------------------------------------------------------------------- 2. a run's life on every backend
# What the backends' controllers would write (none runs here): written as the admin, as they would.


def patch_job_status(kube, backend: str, namespace: str, name: str, status: dict[str, Any]) -> None:
    custom(kube).patch_namespaced_custom_object_status(
        *JOBS[backend][:2], namespace, JOBS[backend][2], name, {"status": status}
    )


def pytorchjob_conditions(kube, namespace: str, name: str, *types: str) -> None:
    """The Kubeflow Training Operator's conditions, in order, the last one True."""
    conditions = [
        {"type": t, "status": "True" if i == len(types) - 1 else "False", "reason": f"PyTorchJob{t}", "message": t}
        for i, t in enumerate(types)
    ]
    patch_job_status(kube, "PyTorchJob", namespace, name, {"conditions": conditions})


def jobset_status(kube, namespace: str, name: str, jobs: dict[str, dict[str, int]], done: bool = False) -> None:
    """The JobSet controller's status: a replicatedJobsStatus entry per replicated job, Completed once ``done``."""
    js = job_of(kube, "JobSet", namespace, name)
    status: dict[str, Any] = {
        "restarts": 0,
        "replicatedJobsStatus": [
            {"name": r["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
            | jobs.get(r["name"], {})
            for r in js["spec"]["replicatedJobs"]
        ],
        "conditions": [condition("Completed", True, "AllJobsCompleted", "jobset completed successfully")]
        if done
        else [],
    }
    if done:
        status["terminalState"] = "Completed"
    patch_job_status(kube, "JobSet", namespace, name, status)


def finished_pod(kube, namespace: str, pod: dict[str, Any], container: str, message: str) -> None:
    """A pod as the kubelet leaves a finished one: its container terminated with ``message``."""
    core = kubernetes.client.CoreV1Api(kube.api())
    pod["spec"] = {
        "containers": [{"name": container, "image": "registry.example/atlas-trainer:test"}],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
    }
    core.create_namespaced_pod(namespace, pod)
    terminated = {"exitCode": 0, "reason": "Completed", "message": message}
    status = {
        "name": container,
        "image": "",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    core.patch_namespaced_pod_status(
        pod["metadata"]["name"], namespace, {"status": {"phase": "Succeeded", "containerStatuses": [status]}}
    )


def jobset_trainer_pod(kube, namespace: str, js: dict[str, Any], message: str) -> None:
    """Rank 0 of a JobSet's trainer job (``trainer``, or ``node`` in the Kubeflow Trainer's), as the JobSet and Job
    controllers label it; owned by the JobSet, so that the garbage collector keeps it."""
    name, uid = js["metadata"]["name"], js["metadata"]["uid"]
    trainer = next(r for r in js["spec"]["replicatedJobs"] if r["name"] in ("trainer", "node"))
    labels = {
        f"{JOBSET_KEY}jobset-name": name,
        f"{JOBSET_KEY}jobset-uid": uid,
        f"{JOBSET_KEY}replicatedjob-name": trainer["name"],
        f"{JOBSET_KEY}restart-attempt": "0",
        COMPLETION_INDEX: "0",
    }
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name, "uid": uid}
    meta = {
        "name": f"{name}-{trainer['name']}-0-0-abcde",
        "labels": labels,
        "annotations": {COMPLETION_INDEX: "0"},
        "ownerReferences": [owner],
    }
    container = trainer["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
    finished_pod(kube, namespace, {"metadata": meta}, container, message)


def suspend_and_resume(kube, manifest: dict[str, Any], backend: str) -> None:
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    for flag in (True, False):
        patch_spec(kube, manifest, {"suspend": flag})
        wait_for(
            lambda f=flag: (
                (spec := job_of(kube, backend, namespace, name)["spec"])
                and bool(spec.get("suspend", (spec.get("runPolicy") or {}).get("suspend"))) is f
            ),
            timeout=TIMEOUT,
            what=f"the {backend}'s suspend {flag}",
        )
        if flag:
            wait_status(kube, manifest, lambda s: s.get("phase") == "Suspended", "the run Suspended")


def pytorchjob_life(kube, manifest: dict[str, Any]) -> None:
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    job = wait_for(lambda: job_of(kube, "PyTorchJob", namespace, name), timeout=TIMEOUT, what="the PyTorchJob")
    pytorchjob_conditions(kube, namespace, name, "Created", "Running")
    wait_status(kube, manifest, lambda s: s.get("phase") == "Running", "the PyTorchJob run Running")
    suspend_and_resume(kube, manifest, "PyTorchJob")
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": name,
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    master = {"metadata": {"name": f"{name}-master-0", "ownerReferences": [owner]}}
    finished_pod(kube, namespace, master, "pytorch", result_message(7, 0.5))
    pytorchjob_conditions(kube, namespace, name, "Created", "Running", "Succeeded")


def jobset_life(kube, manifest: dict[str, Any]) -> None:
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    js = wait_for(lambda: job_of(kube, "JobSet", namespace, name), timeout=TIMEOUT, what="the JobSet")
    jobset_status(kube, namespace, name, {"rollout": {"ready": 1, "active": 1}, "trainer": {"active": 1}})
    wait_status(kube, manifest, lambda s: s.get("phase") == "Running", "the JobSet run Running")
    suspend_and_resume(kube, manifest, "JobSet")
    jobset_trainer_pod(kube, namespace, js, result_message(7, 0.5))
    jobset_status(kube, namespace, name, {"rollout": {"ready": 1, "active": 1}, "trainer": {"succeeded": 1}}, True)


def trainjob_life(kube, manifest: dict[str, Any]) -> None:
    """The Kubeflow Trainer's side, written by hand (the real Trainer runs in tests/kube/test_runs.py): the JobSet
    it makes of the TrainJob — named as it, controlled by it, with the labels of its runtime patches and the chart's
    ClusterTrainingRuntime's template — and the TrainJob's status (its jobs' counts, then Complete)."""
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    tj = wait_for(lambda: job_of(kube, "TrainJob", namespace, name), timeout=TIMEOUT, what="the TrainJob")
    runtime = custom(kube).get_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", tj["spec"]["runtimeRef"]["name"]
    )
    labels: dict[str, str] = {}
    for patch in tj["spec"].get("runtimePatches") or []:
        labels |= ((patch["trainingRuntimeSpec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
    owner = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": name,
        "uid": tj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]},
        "spec": runtime["spec"]["template"]["spec"],
    }
    js = custom(kube).create_namespaced_custom_object(*JOBS["JobSet"][:2], namespace, "jobsets", jobset)

    def trainer_writes(counts: dict[str, int], done: bool = False) -> None:
        jobset_status(kube, namespace, name, {"node": counts}, done)
        jobs = [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0} | counts]
        conditions = [condition("Complete", True, "AllJobsCompleted", "jobset completed successfully")] if done else []
        patch_job_status(kube, "TrainJob", namespace, name, {"jobsStatus": jobs, "conditions": conditions})

    trainer_writes({"active": 1})
    wait_status(kube, manifest, lambda s: s.get("phase") == "Running", "the TrainJob run Running")
    suspend_and_resume(kube, manifest, "TrainJob")
    jobset_trainer_pod(kube, namespace, js, result_message(7, 0.5))
    trainer_writes({"succeeded": 1}, done=True)


LIVES = {"PyTorchJob": pytorchjob_life, "JobSet": jobset_life, "TrainJob": trainjob_life}


def test_run_life_on_every_backend(kube, namespace, operator_release):
    """On each backend a run is created, its job runs (its controller's status, written here), is suspended and
    resumed, succeeds (its rank-0 pod's result read), and the run is deleted: under the tightest RBAC (rbac.scope:
    namespaced, a Role in the release namespace), the API server refuses the operator nothing."""
    release = operator_release(chart_values(namespace, "namespaced"))
    for backend, life in LIVES.items():
        manifest = small_run(f"life-{backend.lower()}", backend)
        create_run(kube, manifest, namespace)
        life(kube, manifest)
        status = wait_status(
            kube,
            manifest,
            lambda s: s.get("phase") == "Succeeded" and s.get("result"),
            f"the {backend} run Succeeded with its result",
        )
        assert status["result"] == {"step": 7, "reward": 0.5}, status
        delete_run(kube, manifest)
        gone = wait_for(
            lambda b=backend, m=manifest: job_of(kube, b, namespace, m["metadata"]["name"]) is None,
            timeout=TIMEOUT,
            what=f"the {backend} deleted",
        )
        assert gone
        assert refused(kube, release) == [], backend
    made = {(e["verb"], (e.get("objectRef") or {}).get("resource")) for e in audit(kube, release)}
    for verb, resource in [("create", plural) for *_, plural in JOBS.values()] + [("list", "pods"), ("get", "pods")]:
        assert (verb, resource) in made, f"the operator never made {verb} {resource}: the test missed a path"


# ------------------------------------------------------------------------------ 3. no Secrets, no wildcards


@pytest.mark.parametrize("scope", ["cluster", "namespaced"])
def test_no_secrets_no_wildcards(kube, namespace, operator_release, scope):
    """The operator's ServiceAccount may not read Secrets (its own namespace, another, cluster-wide), while it may do
    its work; none of its roles holds a wildcard."""
    release = operator_release(chart_values(namespace, scope), start=False)
    account = f"system:serviceaccount:{namespace}:{service_account(kube, release)}"

    def can(*args: str) -> bool:
        done = kube.kubectl("auth", "can-i", *args, f"--as={account}", check=False)
        assert done.stdout.strip() in ("yes", "no"), done.stderr
        return done.stdout.strip() == "yes"

    assert can("create", "configmaps", "-n", namespace) and can(
        "watch", "atlastrainings.atlas.arc.computer", "-n", namespace
    )
    for verb in ("get", "list", "watch"):
        assert not can(verb, "secrets", "-n", namespace), f"{verb} secrets in {namespace}"
        assert not can(verb, "secrets", "-n", "kube-system"), f"{verb} secrets in kube-system"
    assert not can("list", "secrets", "--all-namespaces")
    assert not can("list", "namespaces") and not can("get", f"namespaces/{namespace}")
    assert not can("*", "*", "-n", namespace)
    selector = f"app.kubernetes.io/instance={release.name}"
    roles = kube.get("clusterroles", "-l", selector)["items"] + kube.get("roles", "-A", "-l", selector)["items"]
    assert roles, "the release's roles"
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"], (role["metadata"]["name"], rule)


# ------------------------------------------------------------------------------ 4. a missing rule shows


def test_missing_rule_is_refused_and_reported(kube, namespace, operator_release, tmp_path, monkeypatch):
    """The chart with `create` on ConfigMaps taken out of files/rbac-rules.yaml: the API server refuses the run's
    ConfigMap (the audit log's 403), and the run says so: ChildrenReady False, ChildRejected, naming it."""
    from atlas_cluster import cluster

    chart = tmp_path / "atlas-operator"
    shutil.copytree(cluster.CHART, chart)
    rules_file = chart / "files" / "rbac-rules.yaml"
    rules = yaml.safe_load(rules_file.read_text())
    (rule,) = [r for r in rules["namespaced"] if "configmaps" in r["resources"]]
    rules["namespaced"].append(
        {
            "apiGroups": rule["apiGroups"],
            "resources": ["configmaps"],
            "verbs": [v for v in rule["verbs"] if v != "create"],
        }
    )
    rule["resources"] = [r for r in rule["resources"] if r != "configmaps"]
    rules_file.write_text(yaml.safe_dump(rules, sort_keys=False))
    monkeypatch.setattr(cluster, "CHART", chart)  # LocalCluster.install_chart installs the module's CHART

    release = operator_release(chart_values(namespace))
    manifest = small_run("no-configmap")
    create_run(kube, manifest, namespace)
    status = wait_status(
        kube,
        manifest,
        lambda s: any(c["type"] == "ChildrenReady" and c["status"] == "False" for c in s.get("conditions") or []),
        "ChildrenReady False",
    )
    ready = next(c for c in status["conditions"] if c["type"] == "ChildrenReady")
    assert ready["reason"] == "ChildRejected", ready
    assert "ConfigMap no-configmap-config: 403 Forbidden" in ready["message"], ready
    assert refused(kube, release) == [f"create core/configmaps {namespace}/*"]
    # What it may do it did: the job and the rest were made all the same.
    assert job_of(kube, "PyTorchJob", namespace, "no-configmap") is not None
