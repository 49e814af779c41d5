"""The hosts-file records that stand in for cluster DNS (atlas_cluster/node/dns.py) and the files made of them."""

from __future__ import annotations

from atlas_cluster.node.dns import dns_records, hosts_text
from atlas_cluster.node.podnet import host_hosts_text


def pod(name, ip, labels, ready=True, phase="Running", namespace="ns", hostname=None, subdomain=None, deleting=False):
    meta = {"name": name, "namespace": namespace, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec = {k: v for k, v in (("hostname", hostname), ("subdomain", subdomain)) if v}
    status = {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "spec": spec, "status": status}


def service(name, selector, headless=False, not_ready=False, namespace="ns"):
    spec = {"selector": selector, "clusterIP": "None" if headless else "10.96.0.9"}
    if not_ready:
        spec["publishNotReadyAddresses"] = True
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def names_of(records, ip):
    return {name for _, address, names, short in records if address == ip for name in names + short}


def test_a_service_resolves_to_its_ready_pods_only():
    pods = [pod("a", "10.1.1.2", {"app": "x"}), pod("b", "10.1.1.3", {"app": "x"}, ready=False)]
    records = dns_records(pods, [service("web", {"app": "x"})])
    assert {"web", "web.ns", "web.ns.svc", "web.ns.svc.cluster.local"} <= names_of(records, "10.1.1.2")
    assert "web" not in names_of(records, "10.1.1.3")


def test_publish_not_ready_addresses_names_every_pod():
    pods = [pod("b", "10.1.1.3", {"app": "x"}, ready=False)]
    records = dns_records(pods, [service("web", {"app": "x"}, not_ready=True)])
    assert "web.ns.svc.cluster.local" in names_of(records, "10.1.1.3")


def test_a_headless_service_names_each_pod_of_its_subdomain():
    pods = [
        pod("job-0", "10.1.1.4", {"job": "j"}, hostname="job-0", subdomain="j"),
        pod("job-1", "10.1.1.5", {"job": "j"}, hostname="job-1", subdomain="other"),
    ]
    records = dns_records(pods, [service("j", {"job": "j"}, headless=True)])
    assert {"job-0.j", "job-0.j.ns.svc.cluster.local"} <= names_of(records, "10.1.1.4")
    assert not any(name.startswith("job-1.") for name in names_of(records, "10.1.1.5"))


def test_finished_deleted_or_unaddressed_pods_and_selectorless_services_have_no_records():
    pods = [
        pod("done", "10.1.1.6", {"app": "x"}, phase="Succeeded"),
        pod("going", "10.1.1.7", {"app": "x"}, deleting=True),
        pod("new", None, {"app": "x"}),
    ]
    assert dns_records(pods, [service("web", {"app": "x"}), service("empty", {})]) == []


def test_services_of_another_namespace_do_not_select_a_pod():
    records = dns_records([pod("a", "10.1.1.2", {"app": "x"})], [service("web", {"app": "x"}, namespace="other")])
    assert "web" not in names_of(records, "10.1.1.2")


def test_every_pod_has_its_own_a_record_also_as_an_ipv4_mapped_address():
    records = dns_records([pod("a", "10.1.1.2", {})], [])
    assert records == [
        ("ns", "10.1.1.2", ["10-1-1-2.ns.pod.cluster.local"], []),
        ("ns", "::ffff:10.1.1.2", ["10-1-1-2.ns.pod.cluster.local"], []),
    ]


def test_a_pods_hosts_file_names_itself_and_short_names_only_in_its_namespace():
    records = [("ns", "10.1.1.3", ["web.ns.svc.cluster.local"], ["web"]), ("far", "10.1.1.4", ["db.far"], ["db"])]
    text = hosts_text("ns", "job-0", "j", "10.1.1.2", records)
    lines = text.splitlines()
    assert "10.1.1.2\tjob-0.j.ns.svc.cluster.local job-0" in lines
    assert "10.1.1.3\tweb.ns.svc.cluster.local web" in lines
    assert "10.1.1.4\tdb.far" in lines
    assert "127.0.0.1\tlocalhost" in lines
    assert hosts_text("ns", "solo", None, "10.1.1.9", []).splitlines()[-1] == "10.1.1.9\tsolo"


def test_the_hosts_view_adds_qualified_names_after_the_hosts_own_file():
    text = host_hosts_text("127.0.0.1 localhost\n", [("ns", "10.1.1.3", ["web.ns.svc"], ["web"])])
    assert text == "127.0.0.1 localhost\n# the local cluster's names (atlas process nodes)\n10.1.1.3\tweb.ns.svc\n"
