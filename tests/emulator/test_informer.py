"""The operator's informer (atlas_operator.informer): what it holds and what it reports, fed with the items kopf's
watch-stream yields (a listing's objects with type None, Bookmark.LISTED at its end, then ADDED/MODIFIED/DELETED and
BOOKMARK events). The operator tests run it against the API emulator through kopf's stream; these pin down the
listing, relisting (after a 410 Gone) and namespace logic that a live cluster would rarely show."""

from __future__ import annotations

import logging

import pytest
from atlas_operator import kube
from atlas_operator.informer import Informer
from atlas_operator.kopf_compat import Bookmark
from atlas_operator.reconcile import relevance

LISTED = Bookmark.LISTED


def cm(name: str, version: int, namespace: str = "team-a") -> dict:
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version)}}


def pod(name: str, version: int) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team-a", "resourceVersion": str(version)}}


def informer(namespaces: tuple[str, ...] = ()) -> tuple[Informer, list]:
    seen: list = []
    held = Informer(
        (kube.CONFIG_MAP, kube.SERVICE),
        followed=(kube.POD,),
        namespaces=namespaces,
        on_change=lambda type_, resource, obj: seen.append((type_, resource.plural, obj["metadata"]["name"])),
    )
    return held, seen


def listed(held: Informer, resource: kube.Resource, *objects: dict, namespace: str | None = None) -> None:
    for obj in objects:
        held.handle(resource, namespace, {"type": None, "object": obj})
    held.handle(resource, namespace, LISTED)


def test_the_first_listing_fills_the_store_without_reporting_and_syncs_the_resource():
    held, seen = informer()
    held.handle(kube.CONFIG_MAP, None, {"type": None, "object": cm("a", 1)})
    assert not held.synced("configmaps")  # mid-listing: an object not shown yet may exist
    assert held.get(kube.CONFIG_MAP, "team-a", "a") is None
    held.handle(kube.CONFIG_MAP, None, {"type": None, "object": cm("b", 2)})
    held.handle(kube.CONFIG_MAP, None, LISTED)
    assert held.synced("configmaps") and not held.synced("services")
    assert held.get(kube.CONFIG_MAP, "team-a", "b")["metadata"]["resourceVersion"] == "2"
    assert held.get(kube.SERVICE, "team-a", "a") is None  # keyed by resource too
    assert seen == []  # the resume handlers reconcile every run after a start
    listed(held, kube.SERVICE)  # an empty listing syncs too
    assert held.synced("services") and len(held) == 2


def test_changes_update_the_store_and_are_reported_bookmarks_are_not():
    held, seen = informer()
    listed(held, kube.CONFIG_MAP, cm("a", 1))
    held.handle(kube.CONFIG_MAP, None, {"type": "ADDED", "object": cm("b", 2)})
    held.handle(kube.CONFIG_MAP, None, {"type": "MODIFIED", "object": cm("a", 3)})
    held.handle(kube.CONFIG_MAP, None, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "4"}}})
    held.handle(kube.CONFIG_MAP, None, {"type": "DELETED", "object": cm("b", 5)})
    assert seen == [("ADDED", "configmaps", "b"), ("MODIFIED", "configmaps", "a"), ("DELETED", "configmaps", "b")]
    assert held.get(kube.CONFIG_MAP, "team-a", "a")["metadata"]["resourceVersion"] == "3"
    assert held.get(kube.CONFIG_MAP, "team-a", "b") is None


def test_followed_resources_are_reported_not_held():
    """Pods are not held: each listed one is reported too (a pod that could not start before the operator did)."""
    held, seen = informer()
    listed(held, kube.POD, pod("p", 1), pod("q", 1))
    held.handle(kube.POD, None, {"type": "MODIFIED", "object": pod("p", 2)})
    assert held.synced("pods") and len(held) == 0
    assert seen == [("ADDED", "pods", "p"), ("ADDED", "pods", "q"), ("MODIFIED", "pods", "p")]


def test_a_listing_after_a_gone_watch_reports_what_changed_meanwhile():
    """After a 410 kopf lists again: what was deleted, changed or added while the watch was away is reported
    (a child deleted then is recreated), what stood still is not."""
    held, seen = informer()
    listed(held, kube.CONFIG_MAP, cm("kept", 1), cm("changed", 2), cm("deleted", 3))
    listed(held, kube.CONFIG_MAP, cm("kept", 1), cm("changed", 7), cm("new", 8))
    assert sorted(seen) == [
        ("ADDED", "configmaps", "new"),
        ("DELETED", "configmaps", "deleted"),
        ("MODIFIED", "configmaps", "changed"),
    ]
    assert held.get(kube.CONFIG_MAP, "team-a", "deleted") is None
    assert held.get(kube.CONFIG_MAP, "team-a", "changed")["metadata"]["resourceVersion"] == "7"


def test_each_watched_namespace_lists_on_its_own():
    held, seen = informer(namespaces=("team-a", "team-b"))
    listed(held, kube.CONFIG_MAP, cm("a", 1), namespace="team-a")
    assert not held.synced("configmaps")  # team-b not listed yet
    listed(held, kube.CONFIG_MAP, cm("b", 2, "team-b"), namespace="team-b")
    assert held.synced("configmaps")
    listed(held, kube.CONFIG_MAP, namespace="team-a")  # team-a relisted, now empty: team-b's object stays
    assert held.get(kube.CONFIG_MAP, "team-b", "b") is not None
    assert held.get(kube.CONFIG_MAP, "team-a", "a") is None
    assert seen == [("DELETED", "configmaps", "a")]


def test_a_failing_handler_is_logged_and_the_stream_goes_on(caplog):
    calls = []

    def fails(type_, resource, obj):
        calls.append(obj["metadata"]["name"])
        raise RuntimeError("boom")

    held = Informer((kube.CONFIG_MAP,), on_change=fails)
    listed(held, kube.CONFIG_MAP)
    with caplog.at_level(logging.ERROR, logger="atlas_operator"):
        held.handle(kube.CONFIG_MAP, None, {"type": "ADDED", "object": cm("a", 1)})
        held.handle(kube.CONFIG_MAP, None, {"type": "ADDED", "object": cm("b", 2)})
    assert calls == ["a", "b"]
    assert held.get(kube.CONFIG_MAP, "team-a", "b") is not None
    assert "handling a ADDED event of ConfigMap failed" in caplog.text


def test_one_label_selector_matcher_for_query_strings_and_label_selectors():
    """harness/label_selectors.py: the query-string form a watch sends means what the same LabelSelector means."""
    from harness import label_selectors

    labels = {"app.kubernetes.io/instance": "run", "tier": "web"}
    for text, selector, expected in (
        ("app.kubernetes.io/instance=run", {"matchLabels": {"app.kubernetes.io/instance": "run"}}, True),
        ("tier!=db", {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}, True),
        ("zone!=a", {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
        ("!tier", {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, False),
        (
            "tier in (api, web)",
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["api", "web"]}]},
            True,
        ),
        (
            "tier notin (web),zone",
            {
                "matchExpressions": [
                    {"key": "tier", "operator": "NotIn", "values": ["web"]},
                    {"key": "zone", "operator": "Exists"},
                ]
            },
            False,
        ),
    ):
        assert label_selectors.matches(label_selectors.parse(text), labels) is expected, text
        assert label_selectors.matches(selector, labels) is expected, text
    with pytest.raises(ValueError, match="unable to parse"):
        label_selectors.parse("tier in web")


def test_a_deployments_bookkeeping_is_held_but_only_what_its_run_reads_is_reported():
    """atlas_operator/reconcile/relevance.py: the deployment controller's status writes and revision annotation are
    not news to the run; its ready replicas, its spec and its labels are, and so is every change of a job."""
    seen: list = []
    held = Informer(
        (kube.DEPLOYMENT, kube.PYTORCH_JOB),
        on_change=lambda type_, res, obj: seen.append((type_, res.plural, obj["metadata"]["resourceVersion"])),
        matters=relevance.matters,
    )

    def deployment(version: int, annotations=None, status=None, replicas=1, labels=None) -> dict:
        meta = {"name": "r-rollout", "namespace": "team-a", "resourceVersion": str(version)}
        meta.update({"annotations": annotations or {}, "labels": labels or {"app": "r"}})
        return {"kind": "Deployment", "metadata": meta, "spec": {"replicas": replicas}, "status": status or {}}

    def modified(resource: kube.Resource, obj: dict) -> None:
        held.handle(resource, None, {"type": "MODIFIED", "object": obj})

    listed(held, kube.DEPLOYMENT, deployment(1))
    modified(kube.DEPLOYMENT, deployment(2, {"deployment.kubernetes.io/revision": "1"}))
    modified(kube.DEPLOYMENT, deployment(3, status={"observedGeneration": 1, "replicas": 1, "unavailableReplicas": 1}))
    assert seen == []
    assert held.get(kube.DEPLOYMENT, "team-a", "r-rollout")["metadata"]["resourceVersion"] == "3"  # held all the same
    ready = {"replicas": 1, "readyReplicas": 1}
    modified(kube.DEPLOYMENT, deployment(4, status=ready))
    modified(kube.DEPLOYMENT, deployment(5, status=ready, replicas=2))
    modified(kube.DEPLOYMENT, deployment(6, status=ready, replicas=2, labels={"app": "x"}))
    assert [version for _, _, version in seen] == ["4", "5", "6"]
    job = {"kind": "PyTorchJob", "metadata": {"name": "r", "namespace": "team-a", "resourceVersion": "7"}}
    listed(held, kube.PYTORCH_JOB, job)
    modified(kube.PYTORCH_JOB, {**job, "metadata": {**job["metadata"], "resourceVersion": "8"}, "status": {"x": 1}})
    assert seen[-1] == ("MODIFIED", "pytorchjobs", "8")


def test_the_operator_is_ready_once_every_watch_has_listed_been_unserved_or_refused(monkeypatch, caplog):
    """``started`` (the operator's /readyz): every (resource, namespace) watch's first listing has ended: listed, not
    served (no CRD: none of it exists), or refused by the RBAC (reads of it ask the API server). Until then a
    reconciliation would read every child from the API server."""
    import asyncio

    import kopf
    from atlas_operator import kopf_compat

    held, _ = informer(namespaces=("team-a", "team-b"))
    assert not held.started()
    for namespace in ("team-a", "team-b"):
        listed(held, kube.CONFIG_MAP, namespace=namespace)
        listed(held, kube.POD, namespace=namespace)
    listed(held, kube.SERVICE, namespace="team-a")
    assert not held.started()  # services in team-b: not listed yet

    async def refused(**_):
        raise kopf_compat.APIForbiddenError("services is forbidden", status=403, headers={})
        yield  # an async generator, as kopf's

    async def one_try() -> None:
        task = asyncio.create_task(held._follow(kopf.OperatorSettings(), kube.SERVICE, "team-b"))
        await asyncio.sleep(0.05)  # refused, then waiting to try again
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    monkeypatch.setattr(kopf_compat, "infinite_watch", refused)
    with caplog.at_level("DEBUG", logger="atlas_operator"):
        asyncio.run(one_try())
        asyncio.run(one_try())  # refused again: retried quietly
    assert held.started() and not held.synced("services")
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "cannot watch services" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING", "DEBUG"], said


def test_readyz_answers_503_until_ready_and_healthz_whatever_it_says():
    """metrics.serve: /healthz (liveness) answers while the event loop does; /readyz (readiness) answers 503 until
    ``ready()`` holds, then 200: a different probe, so a starting operator is not restarted for being slow."""
    import asyncio
    import json
    import urllib.error
    import urllib.request

    from atlas_operator import metrics

    from harness.env import free_port

    state = {"ready": False}
    port = free_port()

    def get(path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    async def scenario() -> list[tuple[int, dict]]:
        runner = await metrics.serve("127.0.0.1", port, ready=lambda: state["ready"])
        try:
            seen = [await asyncio.to_thread(get, "/healthz"), await asyncio.to_thread(get, "/readyz")]
            state["ready"] = True
            return [*seen, await asyncio.to_thread(get, "/readyz")]
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == [
        (200, {"status": "ok"}),
        (503, {"status": "starting"}),
        (200, {"status": "ready"}),
    ]


def test_a_standby_is_alive_and_ready_while_it_waits():
    """A standby replica (atlas_operator/leader.py) answers both probes: it is ready to take over, so a Deployment of
    two replicas rolls out."""
    import urllib.request

    from atlas_operator.leader import _health_server

    from harness.env import free_port

    port = free_port()
    server = _health_server("127.0.0.1", port)
    try:
        for path in ("/healthz", "/readyz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                assert (answer.status, answer.read()) == (200, b"ok (standby)")
    finally:
        server.shutdown()
        server.server_close()


def test_announced_resources_report_their_first_listing_and_only_changes_that_are_someones():
    """The runs: every run listed at start is reported (each is reconciled once, as kopf's resume handlers did), and a
    change is news when it is more than the echo of a status write (relevance.run_changed)."""
    seen: list = []
    held = Informer(
        (kube.CONFIG_MAP,),
        announced=(kube.CONFIG_MAP,),
        on_change=lambda type_, resource, obj: seen.append((type_, obj["metadata"]["name"])),
        matters=lambda resource, before, after: before is None or relevance.run_changed(before, after),
    )
    run = cm("run", 1) | {"spec": {"a": 1}}
    run["metadata"]["generation"] = 1
    listed(held, kube.CONFIG_MAP, run)
    assert seen == [("ADDED", "run")]
    status_echo = {**run, "status": {"phase": "Pending"}, "metadata": {**run["metadata"], "resourceVersion": "2"}}
    held.handle(kube.CONFIG_MAP, None, {"type": "MODIFIED", "object": status_echo})
    assert seen == [("ADDED", "run")]  # a status write: no news
    assert held.get(kube.CONFIG_MAP, "team-a", "run")["status"] == {"phase": "Pending"}  # but held
    for change in ({"generation": 2}, {"labels": {"team": "b"}}, {"deletionTimestamp": "2026-12-07T00:00:00Z"}):
        version = int(held.get(kube.CONFIG_MAP, "team-a", "run")["metadata"]["resourceVersion"]) + 1
        changed = {**status_echo, "metadata": {**status_echo["metadata"], **change, "resourceVersion": str(version)}}
        held.handle(kube.CONFIG_MAP, None, {"type": "MODIFIED", "object": changed})
        status_echo = changed
    assert seen == [("ADDED", "run")] + [("MODIFIED", "run")] * 3


def test_an_own_writes_answer_is_held_and_an_older_watch_event_does_not_replace_it():
    """``hold``: the API server's answer to the operator's own write is held at once (the next pass starts from it);
    an event older than it (the watch behind) changes nothing, and the write's own echo is no news."""
    held, seen = informer()
    listed(held, kube.CONFIG_MAP, cm("a", 1))
    held.hold(kube.CONFIG_MAP, cm("a", 5) | {"data": {"written": "yes"}})
    held.hold(kube.CONFIG_MAP, cm("a", 4))  # an answer older than the one held: ignored
    held.handle(kube.CONFIG_MAP, None, {"type": "MODIFIED", "object": cm("a", 3)})
    assert held.get(kube.CONFIG_MAP, "team-a", "a")["data"] == {"written": "yes"} and seen == []
    held.handle(kube.CONFIG_MAP, None, {"type": "MODIFIED", "object": cm("a", 6)})
    assert seen == [("MODIFIED", "configmaps", "a")]
    assert held.get(kube.CONFIG_MAP, "team-a", "a")["metadata"]["resourceVersion"] == "6"
