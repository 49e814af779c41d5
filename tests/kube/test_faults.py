"""Faults on the real control plane, asserted on the API server's own state and audit log:

- the operator SIGKILLed while runs are created and deleted, then restarted (the same replica: its Lease comes back
  at once): every run that exists gets its job exactly once, every deleted run goes with its children, nothing is
  created twice;
- kube-apiserver SIGKILLed in the middle of a burst of runs and started again (same flags, ports, etcd): every run
  converges, nothing is created twice;
- API Priority and Fairness rejecting the operator's ServiceAccount (429, Retry-After): it waits what the server asks,
  does not hot-loop, and every run gets its children;
- etcd compacted under the frozen operator's watches, the API server's watch cache off: 410 Gone, a relist, and no
  change missed.

(The API server down for two minutes while a run trains: tests/kube/test_outage.py.)"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import signal
import threading
import time
from collections import Counter

import kubernetes

from harness.manifests import tiny_training
from tests.kube.conftest import Kube, eventually, start_operator

RUNS = 20
DELETED = ("r0", "r1")


def test_the_operator_killed_while_runs_come_and_go_converges_after_its_restart(
    kube: Kube, namespace, operator_release
):
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    mark = kube.cluster.control_plane.audit_mark()
    release = operator_release()
    process = f"operator-{release.name}"

    def create_runs(*names: str) -> None:  # one request per run, back to back (kubectl apply of a List)
        items = [tiny_training(name) for name in names]
        for run in items:
            run["metadata"]["namespace"] = namespace
        kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def uids(plural: str, group: str = "kubeflow.org", version: str = "v1") -> dict[str, str]:
        listed = custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]
        return {item["metadata"]["name"]: item["metadata"]["uid"] for item in listed}

    def names(plural: str, group: str = "kubeflow.org", version: str = "v1") -> set[str]:
        return set(uids(plural, group, version))

    def runs() -> set[str]:
        return names("atlastrainings", "atlas.arc.computer", "v1alpha1")

    create_runs(*(f"r{i}" for i in range(RUNS // 2)))
    eventually("the operator's first job", lambda: names("pytorchjobs"), timeout=60)
    kube.cluster.supervisor.children[process].send_signal(signal.SIGKILL)  # mid-burst: some runs not reconciled yet
    had_jobs = uids("pytorchjobs")
    create_runs(*(f"r{i}" for i in range(RUNS // 2, RUNS)))
    for name in DELETED:  # a run kopf already finalized stays Terminating until the operator is back
        kube.kubectl("delete", "atlastraining", name, "-n", namespace, "--wait=false")

    start_operator(kube, release, process)
    restarted = time.monotonic()
    kept = {f"r{i}" for i in range(RUNS)} - set(DELETED)
    eventually(
        "every kept run's job, and the deleted runs gone",
        lambda: names("pytorchjobs") == kept and runs() == kept,
        timeout=120,
    )
    print(
        f"operator killed after {len(had_jobs)} of {RUNS // 2} jobs; converged {time.monotonic() - restarted:.1f} s "
        "after its restart"
    )

    events = [
        e
        for e in kube.cluster.control_plane.audit_events(mark)
        if e.get("objectRef", {}).get("resource") == "pytorchjobs" and e["objectRef"].get("namespace") == namespace
    ]
    created = Counter(
        e["objectRef"].get("name")
        for e in events
        if e["verb"] == "create" and e.get("responseStatus", {}).get("code") == 201
    )
    # Nothing created twice, and no kept run's job deleted to be made again. (A create the SIGKILL cut short may be in
    # etcd with its audit line saying otherwise: the answer is what the dead client did not read, so the count of
    # 201s is not asserted, only that none repeats.)
    assert [name for name, count in created.items() if count > 1] == [], created
    assert not [e for e in events if e["verb"] == "delete" and e["objectRef"].get("name") in kept], events
    assert set(created) <= kept | set(DELETED), created
    jobs = uids("pytorchjobs")
    assert {name: uid for name, uid in had_jobs.items() if name in kept} == {
        name: jobs[name] for name in had_jobs if name in kept
    }  # the same objects


# ---------------------------------------------------------------------- the API server SIGKILLed mid-burst

BURST = 40


def etcd_count(kube: Kube, prefix: str) -> int:
    """The keys under ``prefix`` in etcd itself (readable while the API server is down)."""
    start = prefix.encode()
    end = start[:-1] + bytes([start[-1] + 1])
    answer = kube.cluster.control_plane.etcd(
        "/v3/kv/range",
        {"key": base64.b64encode(start).decode(), "range_end": base64.b64encode(end).decode(), "count_only": True},
    )
    return int(answer.get("count", 0))


def reconciled(run: dict) -> bool:
    """The run's status is written, for its current spec."""
    status = run.get("status") or {}
    return bool(status.get("phase")) and status.get("observedGeneration") == run["metadata"]["generation"]


def runs_list(namespace: str, names: list[str]) -> str:
    """``kubectl apply`` input making one run per name, one request each, back to back."""
    items = [tiny_training(name) for name in names]
    for run in items:
        run["metadata"]["namespace"] = namespace
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def test_the_api_server_killed_mid_burst_every_run_converges_and_nothing_is_created_twice(
    kube: Kube, namespace, operator_release
):
    plane = kube.cluster.control_plane
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    # Its own namespace only (runs earlier tests left, Terminating with their finalizers, are no work of this test's);
    # no leader election: a leader whose renewals fail for 7 s exits by design (atlas_operator/leader.py), and an API
    # server restarting may take that long.
    release = operator_release({"watchNamespaces": [namespace], "operator": {"leaderElection": False}})
    mark = plane.audit_mark()
    names = [f"b{i}" for i in range(BURST)]
    burst = threading.Thread(
        target=kube.kubectl, args=("apply", "-f", "-"), kwargs={"input": runs_list(namespace, names), "check": False}
    )
    burst.start()
    jobs_key, runs_key = (
        f"/registry/kubeflow.org/pytorchjobs/{namespace}/",
        f"/registry/atlas.arc.computer/atlastrainings/{namespace}/",
    )
    eventually("the operator's first job", lambda: etcd_count(kube, jobs_key), timeout=60, every=0.05)
    plane.kill_apiserver()
    had_runs, had_jobs = etcd_count(kube, runs_key), etcd_count(kube, jobs_key)  # what etcd holds at the kill
    burst.join()
    assert 0 < had_jobs < BURST, f"the kill was not mid-burst: {had_jobs} of {BURST} jobs"
    plane.start_apiserver()
    restarted = time.monotonic()
    kube.kubectl("apply", "-f", "-", input=runs_list(namespace, names))  # the runs the killed burst did not make

    def converged() -> bool:
        jobs = custom.list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")["items"]
        runs = custom.list_namespaced_custom_object("atlas.arc.computer", "v1alpha1", namespace, "atlastrainings")
        reported = [r for r in runs["items"] if reconciled(r)]
        return {j["metadata"]["name"] for j in jobs} == set(names) and len(reported) == BURST

    eventually("every run's job and status", converged, timeout=180)
    took = time.monotonic() - restarted
    print(
        f"kube-apiserver killed with {had_runs} of {BURST} runs and {had_jobs} jobs in etcd; every run converged "
        f"{took:.1f} s after its restart (ready in {plane.ready_after['kube-apiserver']:.1f} s)"
    )
    # A request the kill cut short is a temporary error, retried after ATLAS_RETRY_DELAY; not an exception, which kopf
    # retries after a minute (its default back-off).
    assert "failed with an exception" not in release.operator_log.read_text()

    events = [
        e
        for e in plane.audit_events(mark)
        if e.get("objectRef", {}).get("resource") == "pytorchjobs" and e["objectRef"].get("namespace") == namespace
    ]
    created = Counter(
        e["objectRef"].get("name")
        for e in events
        if e["verb"] == "create" and e.get("responseStatus", {}).get("code") == 201
    )
    assert [name for name, count in created.items() if count > 1] == [], created  # nothing created twice
    assert not [e for e in events if e["verb"] == "delete"]  # nor deleted to be made again
    # A create the kill cut short may be in etcd without its audit line (written after the write): at most the
    # requests in flight then, one per handler thread.
    print(f"{len(created)} creates answered 201, {BURST - len(created)} lost their answer to the kill")
    assert len(created) >= BURST - 16


# ---------------------------------------------------------------------- API Priority and Fairness

FLOWCONTROL = "flowcontrol.apiserver.k8s.io/v1"


def throttling(namespace: str, account: str) -> list[dict]:
    """A priority level of minimal concurrency that rejects what exceeds it (429 with Retry-After), and FlowSchemas
    ahead of the built-in ones (precedence 9000 for ServiceAccounts) sending the ServiceAccount's requests there — but
    its Lease's, which go to the built-in leader-election level as kube-system's controllers' do (a leader whose
    renewals are rejected for its deadline exits, by design: operator/atlas_operator/leader.py)."""
    subject = {"kind": "ServiceAccount", "serviceAccount": {"namespace": namespace, "name": account}}
    every = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    leases = {"verbs": ["*"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": [namespace]}
    level = f"{namespace}-throttled"
    return [
        {
            "apiVersion": FLOWCONTROL,
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": level},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": 1,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {"type": "Reject"},
                },
            },
        },
        {
            "apiVersion": FLOWCONTROL,
            "kind": "FlowSchema",
            "metadata": {"name": f"{namespace}-leases"},
            "spec": {
                "priorityLevelConfiguration": {"name": "leader-election"},
                "matchingPrecedence": 40,
                "rules": [{"subjects": [subject], "resourceRules": [leases]}],
            },
        },
        {
            "apiVersion": FLOWCONTROL,
            "kind": "FlowSchema",
            "metadata": {"name": level},
            "spec": {
                "priorityLevelConfiguration": {"name": level},
                "matchingPrecedence": 50,
                "rules": [
                    {
                        "subjects": [subject],
                        "resourceRules": [every],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        },
    ]


def audit_time(event: dict) -> float:
    return datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


THROTTLED_RUNS = 16
# Unthrottled, a run costs the operator about 17 requests (its finalizer, reads and creates of its children, status
# patches, Events: the audit log of the burst above); throttled, each rejected request is sent again after its
# Retry-After. A client that retried at once would spend hundreds per run while the level is saturated.
REQUESTS_PER_RUN_MAX = 40


def test_api_priority_and_fairness_throttles_the_operator_which_honours_retry_after(
    kube: Kube, namespace, operator_release
):
    plane = kube.cluster.control_plane
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    # One run per namespace: a request the API server rejects names no object in the audit log, but its path names
    # the namespace, so each rejected request pairs with the next one sent to its path — its retry. The operator
    # watches those namespaces only: runs earlier tests left (Terminating, with their finalizers) are not its work.
    spaces = [f"{namespace}-{i}"[:63] for i in range(THROTTLED_RUNS)]
    kube.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in spaces],
            }
        ),
    )
    started_at = plane.audit_mark()
    release = operator_release({"watchNamespaces": spaces})
    deployment = kube.cluster.operator_deployment(release.name, release.namespace)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    user = f"system:serviceaccount:{namespace}:{account}"

    def listed() -> bool:  # every watch of the operator has made its first listing (kopf logs each watch's start)
        watches = release.operator_log.read_text().count("Starting the watch-stream for ")
        lists = [e for e in plane.audit_events(started_at) if e["user"]["username"] == user and e["verb"] == "list"]
        return watches > 0 and len(lists) >= watches

    # Throttled once its watches are up: their first listings all rejected at once would each wait the same
    # Retry-After and come back together, only to be rejected together again.
    eventually("the operator's watches listed", listed, timeout=60)
    objects = throttling(namespace, account)
    try:
        kube.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
        schemas = [o["metadata"]["name"] for o in objects if o["kind"] == "FlowSchema"]

        def in_force() -> bool:  # the API server's flow-control controller took the FlowSchemas in
            conditions = [
                c
                for name in schemas
                for c in kube.get("flowschema", name).get("status", {}).get("conditions", [])
                if c["type"] == "Dangling"
            ]
            return len(conditions) == len(schemas) and all(c["status"] == "False" for c in conditions)

        eventually("the FlowSchemas in force", in_force, timeout=30)
        mark = plane.audit_mark()
        started = time.monotonic()
        items = [tiny_training("run") for _ in spaces]
        for run, space in zip(items, spaces, strict=True):
            run["metadata"]["namespace"] = space
        kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

        def converged() -> bool:
            runs = custom.list_cluster_custom_object("atlas.arc.computer", "v1alpha1", "atlastrainings")["items"]
            jobs = custom.list_cluster_custom_object("kubeflow.org", "v1", "pytorchjobs")["items"]
            with_jobs = {j["metadata"]["namespace"] for j in jobs}
            done = {
                r["metadata"]["namespace"] for r in runs if reconciled(r) and r["metadata"]["namespace"] in with_jobs
            }
            return set(spaces) <= done

        eventually("every run's job and status, throttled", converged, timeout=240)
        took = time.monotonic() - started
    finally:
        for o in objects:
            kube.kubectl("delete", o["kind"].lower(), o["metadata"]["name"], "--ignore-not-found", check=False)
        kube.kubectl("delete", "namespace", *spaces, "--wait=false", check=False)

    events = sorted((e for e in plane.audit_events(mark) if e["user"]["username"] == user), key=audit_time)
    rejected = [e for e in events if e["responseStatus"].get("code") == 429]
    assert rejected, "no request of the operator was rejected: the priority level did not throttle it"
    first, last = audit_time(rejected[0]), audit_time(rejected[-1])
    window = [e for e in events if first <= audit_time(e) <= last]
    per_second = Counter(int(audit_time(e)) for e in rejected)
    waits = [
        int(w) for w in re.findall(r"with the retry-after (\d+)s from the server", release.operator_log.read_text())
    ]
    print(
        f"{THROTTLED_RUNS} runs converged in {took:.1f} s throttled: {len(events)} requests of the operator "
        f"({len(events) / THROTTLED_RUNS:.1f} per run), {len(rejected)} answered 429 "
        f"({Counter(e['userAgent'].split('/')[0] for e in rejected)}); while throttled ({last - first:.1f} s) "
        f"{len(window) / max(last - first, 1):.1f} requests/s, at most {max(per_second.values())} rejected in one "
        f"second; kopf waited the server's Retry-After {len(waits)} times ({min(waits, default=0)}-"
        f"{max(waits, default=0)} s)"
    )

    # Retry-After honoured: the operator's own client (atlas_operator/kube.py) sends a rejected request again no
    # sooner than 1 s (the least Retry-After the API server sends) after its 429. (An Event is a new object each time,
    # not a retry; kopf's are its own: a run's status is patched by its handler and its timer, two senders, one path.)
    own = [
        e
        for e in events
        if e["userAgent"].startswith("atlas-operator/") and e.get("objectRef", {}).get("resource") != "events"
    ]

    def request(e: dict) -> tuple:  # the same request sent again: a create's URI is its collection's, so its name too
        return e["verb"], e["requestURI"], e.get("objectRef", {}).get("name")

    # A run's children of one kind are created together (atlas_operator/reconcile/concurrency.py), and a create the
    # API server rejects before reading its body has no name in the log: up to its siblings' number of same-URI
    # creates may follow it at once without being its retries.
    made = Counter(e["requestURI"] for e in own if e["verb"] == "create" and e["responseStatus"].get("code", 500) < 300)
    early = []
    for i, event in enumerate(own):
        if event["responseStatus"].get("code") != 429:
            continue
        soon = [e for e in own[i + 1 :] if request(e) == request(event) and audit_time(e) - audit_time(event) < 1.0]
        siblings = made[event["requestURI"]] - 1 if request(event)[2] is None and event["verb"] == "create" else 0
        if len(soon) > siblings:
            early.append((event["verb"], event["requestURI"], round(audit_time(soon[0]) - audit_time(event), 3)))
    assert early == [], early
    # No hot loop: rejections never outnumber the requests served; a run costs a bounded number of requests; and a run
    # has three senders at most — kopf's worker with its handler, its timer, a refresh for a child's change — each
    # waiting 1 s at least after a 429 (the watches listed before the throttling), so at most three rejections per
    # run in any one second.
    assert len(rejected) < len(events) - len(rejected)
    assert len(events) / THROTTLED_RUNS < REQUESTS_PER_RUN_MAX
    assert max(per_second.values()) <= 3 * THROTTLED_RUNS, per_second


# ---------------------------------------------------------------------- etcd compacted under the operator's watches

# What the operator watches: kopf the runs, the informer (atlas_operator/informer.py) their children and pods.
WATCHED = (
    "atlastrainings",
    "atlasteachers",
    "configmaps",
    "services",
    "deployments",
    "pytorchjobs",
    "jobsets",
    "trainjobs",
    "networkpolicies",
    "pods",
)


def test_etcd_compacted_under_the_frozen_operators_watches_it_relists_and_misses_no_change(
    kube: Kube, namespace, operator_release
):
    """The operator frozen (SIGSTOP) while runs and children change; etcd compacted to its current revision; the API
    server restarted with its watch cache off (--watch-cache=false), so the operator's watches, reconnecting from the
    resourceVersions they last saw, are served from etcd: 410 Gone. The operator resumed lists again and acts on
    every change it missed. The package's API server gets its own flags back after."""
    plane, supervisor = kube.cluster.control_plane, kube.cluster.supervisor
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    core = kubernetes.client.CoreV1Api(kube.api())
    # No leader election: a frozen leader's Lease lapses, and on waking it exits (atlas_operator/leader.py).
    release = operator_release({"watchNamespaces": [namespace], "operator": {"leaderElection": False}})
    process = supervisor.children[f"operator-{release.name}"]
    kube.kubectl("apply", "-f", "-", input=runs_list(namespace, ["kept", "changed", "deleted"]))

    def run(name: str) -> dict | None:
        try:
            return custom.get_namespaced_custom_object(
                "atlas.arc.computer", "v1alpha1", namespace, "atlastrainings", name
            )
        except kubernetes.client.ApiException:
            return None

    def job(name: str) -> dict | None:
        try:
            return custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", name)
        except kubernetes.client.ApiException:
            return None

    def children(name: str) -> list[str]:
        selector = f"app.kubernetes.io/instance={name}"
        kinds = ("configmaps", "services", "pytorchjobs", "networkpolicies")
        return [
            f"{kind}/{o['metadata']['name']}"
            for kind in kinds
            for o in kube.get(kind, "-n", namespace, "-l", selector)["items"]
        ]

    eventually("the runs' jobs", lambda: all(job(n) and reconciled(run(n)) for n in ("kept", "changed", "deleted")))
    config = core.read_namespaced_config_map("kept-config", namespace)
    flags = plane.apiserver_args
    try:
        os.killpg(process.pid, signal.SIGSTOP)
        try:
            core.delete_namespaced_config_map("kept-config", namespace)  # a child the operator must make again
            kube.kubectl("apply", "-f", "-", input=runs_list(namespace, ["new-0", "new-1"]))
            custom.patch_namespaced_custom_object(
                "atlas.arc.computer", "v1alpha1", namespace, "atlastrainings", "changed", {"spec": {"suspend": True}}
            )
            kube.kubectl("delete", "atlastraining", "deleted", "-n", namespace, "--wait=false")
            plane.kill_apiserver()  # nobody writes now: etcd's last revision (R) is the newest the operator may know
            # Two revisions more, of a key outside the API server's: a watch from R starts at R + 1, which the
            # compaction then removes too (etcd keeps the revision it compacts at).
            for _ in range(2):
                plane.etcd(
                    "/v3/kv/put", {"key": base64.b64encode(b"/atlas-tests/compaction").decode(), "value": "MQ=="}
                )
            revision = plane.compact_etcd()
            mark = plane.audit_mark()
            plane.start_apiserver([*flags, "--watch-cache=false"])
            log_from = release.operator_log.stat().st_size
        finally:
            os.killpg(process.pid, signal.SIGCONT)
        resumed = time.monotonic()

        def caught_up() -> bool:
            remade = core.list_namespaced_config_map(namespace, field_selector="metadata.name=kept-config").items
            suspended = ((job("changed") or {}).get("spec", {}).get("runPolicy") or {}).get("suspend")
            return bool(
                remade
                and remade[0].metadata.uid != config.metadata.uid
                and suspended
                and all(job(n) and reconciled(run(n)) for n in ("new-0", "new-1", "changed"))
                and run("deleted") is None
                and not children("deleted")
            )

        eventually("every change made while the operator was frozen", caught_up, timeout=90)
        took = time.monotonic() - resumed
        log = release.operator_log.read_text()[log_from:]
        user = f"system:serviceaccount:{namespace}:"
        lists = Counter(
            e["objectRef"]["resource"]
            for e in plane.audit_events(mark)
            if e["user"]["username"].startswith(user) and e["verb"] == "list"
        )
        gone = [plural for plural in WATCHED if f"Restarting the watch-stream for {plural}." in log]
        print(
            f"etcd compacted at revision {revision}; after the restart the operator's watches got 410 Gone for "
            f"{len(gone)} of {len(WATCHED)} resources and listed again {sum(lists.values())} times ({dict(lists)}); "
            f"every missed change acted on {took:.1f} s after it resumed"
        )
        assert gone == list(WATCHED), log[-3000:]  # kopf logs a watch's 410 so
        assert set(WATCHED) <= set(lists), lists  # and lists again after it
    finally:
        plane.kill_apiserver()
        plane.start_apiserver(flags)
