"""What the operator relies on from the API server, on a real one (tests/kube/conftest.py): the status subresource,
``metadata.generation`` and ``status.observedGeneration``, server-side apply and JSON merge patches, label-selector
watches, and resourceVersion preconditions. Each case is checked on the server itself and by the operator's outcome.
"""

from __future__ import annotations

import json
import time

import pytest
from atlas_operator import kube as k8s
from atlas_operator.kube import ApiError

from harness.manifests import GROUP, VERSION, training
from harness.polling import wait_for
from tests.kube.test_ownership import TIMEOUT, Cluster, deployment_settled, shared_namespace

pytestmark = pytest.mark.timeout(300)
MANAGED_BY = "app.kubernetes.io/managed-by"
KIND = "AtlasTraining"


@pytest.fixture(scope="module")
def cluster(kube):
    """One namespace and one operator for the module's cases (each uses runs of its own)."""
    with shared_namespace(kube, "watch") as shared:
        yield shared


def reconciled(cluster: Cluster, manifest: dict) -> dict:
    """The run once the operator reported on its current generation (every condition too)."""

    def done():
        run = cluster.run(manifest)
        status = run.get("status") or {}
        generation = run["metadata"]["generation"]
        conditions = status.get("conditions") or []
        ok = status.get("observedGeneration") == generation and all(
            c.get("observedGeneration") == generation for c in conditions
        )
        return run if ok and conditions else None

    try:
        return wait_for(done, timeout=TIMEOUT, interval=0.1, what="observedGeneration == generation")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {json.dumps(cluster.run(manifest))[:3000]}") from None


def test_status_is_a_subresource_and_the_operator_writes_it_there(cluster):
    manifest = training("sub")
    cluster.create_run(manifest)
    run = reconciled(cluster, manifest)
    version = run["metadata"]["resourceVersion"]

    # A status written through the main resource is dropped; the request changes nothing, not even the
    # resourceVersion (the emulator gives every write a new one, and a watch event).
    patched = cluster.patch_run(manifest, {"status": {"phase": "Failed", "observedGeneration": 99}})
    assert patched["status"] == run["status"]
    assert patched["metadata"]["resourceVersion"] == version
    # A spec written through /status is dropped: no new generation.
    patched = cluster.patch_run(manifest, {"spec": {"model": "someone/else"}}, subresource="status")
    assert patched["spec"] == run["spec"] and patched["metadata"]["generation"] == run["metadata"]["generation"]

    # The server's own record of who wrote what: the operator's writes all went through /status (no finalizer: the
    # main resource is the user's alone).
    managers = cluster.run(manifest)["metadata"]["managedFields"]
    operator = [m for m in managers if m["manager"] in ("kopf", "atlas-operator")]
    assert {m.get("subresource") for m in operator} == {"status"}, managers
    for entry in managers:
        if "f:status" in entry["fieldsV1"]:
            assert entry.get("subresource") == "status", entry
    writes = cluster.operator_writes(names={"sub"})
    assert {w for w in writes if w.startswith("patch atlastrainings/")} == {"patch atlastrainings/sub/status"}, writes


def quiet(cluster: Cluster, mark: int, seconds: float) -> list[dict]:
    """The operator's requests since ``mark``, once none has come in the namespace for ``seconds``."""
    seen, since = -1, time.monotonic()
    while True:
        requests = cluster.operator_requests(mark)
        count = sum(  # the leader's Lease, renewed every 2 s in this namespace too, aside
            (ref := e.get("objectRef") or {}).get("namespace") == cluster.namespace and ref.get("resource") != "leases"
            for e in requests
        )
        if count != seen:
            seen, since = count, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return requests
        time.sleep(0.2)


def test_a_new_run_is_written_once_though_the_deployment_controller_keeps_writing_its_server(cluster):
    """The deployment controller writes a new server Deployment's status (and its revision annotation) two or three
    times in its first second, none of it what the run's status reads (atlas_operator/reconcile/relevance.py); and
    those writes race the run's first status write, which kopf makes after the handler. A new run costs its children,
    one status write, its Event once (a Warning: a new run's Pending is no news), and no read of the run again."""
    names = [f"new-{i}" for i in range(3)]
    mark = cluster.audit_mark()
    for name in names:
        cluster.create_run(training(name))
    for name in names:
        reconciled(cluster, training(name))
    for name in names:  # the controller's writes are over (its Progressing condition says the ReplicaSet is made)
        wait_for(lambda n=name: deployment_settled(cluster, f"{n}-rollout", replicas=1), timeout=TIMEOUT, what=name)
    # Then the operator's own reaction to the last of them, if it had one: nothing of its in the namespace for 2 s
    # (waiting longer only gives an extra request time to show).
    requests = quiet(cluster, mark, 2.0)
    for name in names:
        run_requests = [
            f"{e['verb']} {ref.get('subresource') or ''}".strip()
            for e in requests
            if (ref := e.get("objectRef") or {}).get("resource") == "atlastrainings" and ref.get("name") == name
        ]
        assert run_requests == ["patch status"], (name, run_requests)
        listed = cluster.client.request("GET", k8s.EVENT.path(cluster.namespace))["items"]
        events = [e for e in listed if e["involvedObject"] == {**e["involvedObject"], "name": name, "kind": KIND}]
        # Once: the warning that the run's two nodes keep no shared checkpoints, after the status that says it.
        assert [e["reason"] for e in events] == ["CheckpointsNotShared"], events
        # It tells of the run as its one status write left it (posted at that write's echo, not before it).
        assert (
            events[0]["involvedObject"]["resourceVersion"] == cluster.run(training(name))["metadata"]["resourceVersion"]
        )


def test_generation_moves_with_the_spec_only_and_observed_generation_follows(cluster):
    manifest = training("gen")
    cluster.create_run(manifest)
    run = reconciled(cluster, manifest)
    assert run["metadata"]["generation"] == 1
    # Labels, annotations and status are not the spec: no new generation.
    cluster.patch_run(manifest, {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}}})
    cluster.patch_run(manifest, {"status": {"restarts": 0}}, subresource="status")
    assert cluster.run(manifest)["metadata"]["generation"] == 1
    # A spec change is one: the operator reports on it.
    cluster.patch_run(manifest, {"spec": {"training": {"maxSteps": 20}}})
    run = reconciled(cluster, manifest)
    assert run["metadata"]["generation"] == 2
    job = cluster.get(k8s.PYTORCH_JOB, "gen")
    assert job["metadata"]["annotations"]["atlas.arc.computer/run-generation"] in ("1", "2")
    # A spec write that changes nothing (the same value again) is no new generation either.
    cluster.patch_run(manifest, {"spec": {"training": {"maxSteps": 20}}})
    assert cluster.run(manifest)["metadata"]["generation"] == 2


def test_server_side_apply_by_the_user_keeps_what_the_operator_wrote(cluster):
    """A user applies the run with server-side apply, then applies it again without a field: the field is removed
    (it was theirs alone), the generation moves and the operator follows; the operator's status (kopf's fields) stays,
    since an apply removes only what its own manager set, and no finalizer comes back."""
    manifest = training("ssa")
    manifest["metadata"]["namespace"] = cluster.namespace
    manifest["spec"]["env"] = [{"name": "HF_HUB_OFFLINE", "value": "1"}]

    def apply(document: dict) -> None:
        cluster.kube.kubectl("apply", "--server-side", "--field-manager=user", "-f", "-", input=json.dumps(document))

    apply(manifest)
    before = reconciled(cluster, manifest)
    del manifest["spec"]["env"]
    apply(manifest)
    run = cluster.run(manifest)
    assert "env" not in run["spec"]
    assert run["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert "finalizers" not in run["metadata"]
    assert run["status"]["children"] == before["status"]["children"]
    reconciled(cluster, manifest)


def test_merge_patches_restore_what_the_operator_owns_and_keep_what_others_add(cluster):
    """The operator's JSON merge patches on a real server: a Service's selector key someone added is removed (null),
    its ports list is replaced (not merged by key, as a strategic merge patch would), a NetworkPolicy is put back
    exactly; a label someone else added is kept. Each change reaches the operator through its watch."""
    manifest = training("drift")
    cluster.create_run(manifest)
    status = reconciled(cluster, manifest)["status"]
    metrics, network = status["children"]["metricsService"], status["children"]["networkPolicy"]
    service = wait_for(lambda: cluster.get(k8s.SERVICE, metrics), timeout=TIMEOUT, what="metrics Service")
    policy = cluster.get(k8s.NETWORK_POLICY, network)
    ports = service["spec"]["ports"]
    cluster.client.patch(
        k8s.SERVICE,
        cluster.namespace,
        metrics,
        {
            "metadata": {"labels": {"team": "a"}},
            "spec": {"selector": {"rogue": "1"}, "ports": [*ports, {"name": "extra", "port": 81, "protocol": "TCP"}]},
        },
    )
    cluster.client.patch(
        k8s.NETWORK_POLICY,
        cluster.namespace,
        network,
        {
            "spec": {"podSelector": {"matchLabels": {"rogue": "1"}}, "ingress": [{}]},
        },
    )

    def restored(resource, name, original):
        now = cluster.get(resource, name)
        return now if now["spec"] == original["spec"] else None

    now = wait_for(lambda: restored(k8s.SERVICE, metrics, service), timeout=TIMEOUT, what="Service restored")
    assert now["metadata"]["labels"]["team"] == "a"
    wait_for(lambda: restored(k8s.NETWORK_POLICY, network, policy), timeout=TIMEOUT, what="NetworkPolicy restored")


def test_a_child_that_leaves_the_operators_label_selector_is_labelled_again(cluster):
    """The operator watches its children through a label selector: a real server sends the watch a DELETED event
    when an object's labels stop matching (the emulator sends nothing). The operator, told so, finds its Service
    still there and puts its label back."""
    manifest = training("unlabelled")
    cluster.create_run(manifest)
    status = reconciled(cluster, manifest)["status"]
    metrics = status["children"]["metricsService"]
    wait_for(lambda: cluster.get(k8s.SERVICE, metrics), timeout=TIMEOUT, what="metrics Service")
    cluster.client.patch(k8s.SERVICE, cluster.namespace, metrics, {"metadata": {"labels": {MANAGED_BY: None}}})
    wait_for(
        lambda: (cluster.get(k8s.SERVICE, metrics)["metadata"].get("labels") or {}).get(MANAGED_BY),
        timeout=TIMEOUT,
        what="the label back",
    )


def test_stale_writes_are_refused_and_the_operator_converges_on_the_last_spec(cluster):
    manifest = training("stale")
    cluster.create_run(manifest)
    run = reconciled(cluster, manifest)
    stale = run["metadata"]["resourceVersion"]
    cluster.patch_run(manifest, {"metadata": {"labels": {"touched": "1"}}})
    resource = k8s.Resource(GROUP, VERSION, "atlastrainings", "AtlasTraining")
    path = resource.path(cluster.namespace, "stale")
    # kopf's JSON patches (its finalizer) test the resourceVersion they read: a stale one is a 422, which kopf takes
    # as "newer changes pending" (a 409 would be an error to it).
    with pytest.raises(ApiError) as refused:
        cluster.client.request(
            "PATCH",
            path,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                {"op": "add", "path": "/metadata/labels/x", "value": "1"},
            ],
            content_type="application/json-patch+json",
        )
    assert refused.value.status == 422
    # A merge patch or a replace carrying a stale resourceVersion is a 409 Conflict.
    for method, body, content_type in (
        ("PATCH", {"metadata": {"resourceVersion": stale, "labels": {"x": "1"}}}, "application/merge-patch+json"),
        ("PUT", {**run, "metadata": {**run["metadata"], "resourceVersion": stale}}, "application/json"),
    ):
        with pytest.raises(ApiError) as refused:
            cluster.client.request(method, path, body, content_type=content_type)
        assert (refused.value.status, refused.value.reason) == (409, "Conflict"), method

    # Another writer changes the run again and again while the operator reconciles it: whatever it read in between,
    # it ends on the last spec (the job's suspend is applied in place) and reports that generation.
    mark = cluster.audit_mark()
    for suspend in (True, False, True, False, True):
        cluster.patch_run(manifest, {"spec": {"suspend": suspend}})
    run = reconciled(cluster, manifest)
    assert run["spec"]["suspend"] is True, run["spec"]
    # The phase follows the job, which the pass that observed this generation may have patched after reading it:
    # the next pass (the job's watch event) reports it.
    wait_for(
        lambda: (cluster.run(manifest).get("status") or {}).get("phase") == "Suspended",
        timeout=TIMEOUT,
        what="phase Suspended",
    )
    job = cluster.get(k8s.PYTORCH_JOB, "stale")
    assert job["spec"]["runPolicy"]["suspend"] is True, job["spec"]["runPolicy"]
    failed = [e for e in cluster.operator_requests(mark) if e["responseStatus"]["code"] >= 400]
    assert all(e["responseStatus"]["code"] in (404, 409, 422) for e in failed), failed
