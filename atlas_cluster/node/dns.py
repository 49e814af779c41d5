"""What cluster DNS would answer, as hosts-file lines: each Service's endpoints, each headless Service's
``<hostname>.<subdomain>`` pods, each pod's own A record (the process node has no DNS server: every pod's
/etc/hosts, written by atlas_cluster/node/podnet.py, carries these names)."""

from __future__ import annotations

Record = tuple[str, str, list[str], list[str]]  # (namespace, ip, qualified names, short names)


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ready(pod: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def dns_records(pods: list[dict], services: list[dict]) -> list[Record]:
    """What cluster DNS would answer, as hosts-file records (namespace, ip, qualified names, short names): each
    Service with a selector → its endpoints' pod IPs (ready ones; all with ``publishNotReadyAddresses``), and for a
    headless one, ``<hostname>.<service>`` of each endpoint pod whose ``subdomain`` is the Service."""
    by_namespace: dict[str, list[dict]] = {}
    for pod in pods:
        status = pod.get("status") or {}
        if (
            status.get("podIP")
            and status.get("phase") not in ("Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp")
        ):
            by_namespace.setdefault(pod["metadata"]["namespace"], []).append(pod)
    records = []
    for service in services:
        spec, meta = service.get("spec") or {}, service["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        selector = spec.get("selector") or {}
        members = [
            pod
            for pod in by_namespace.get(namespace, [])
            if selector_matches(selector, pod["metadata"].get("labels") or {})
            and (spec.get("publishNotReadyAddresses") or pod_ready(pod))
        ]
        qualified = [f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
        for pod in members:
            records.append((namespace, pod["status"]["podIP"], qualified, [name]))
        if spec.get("clusterIP") == "None":
            for pod in members:
                host = pod["spec"].get("hostname")
                if host and pod["spec"].get("subdomain") == name:
                    names = [f"{host}.{q}" for q in qualified]
                    records.append((namespace, pod["status"]["podIP"], names, [f"{host}.{name}"]))
    # Every pod's own A record (``10-244-1-5.<ns>.pod.cluster.local``), also as the IPv4-mapped IPv6 address: reverse
    # lookups of a peer's address (torch's c10d store does one per client, on a dual-stack socket) are answered
    # from the file too.
    for namespace, members in sorted(by_namespace.items()):
        for pod in members:
            address = pod["status"]["podIP"]
            name = f"{address.replace('.', '-')}.{namespace}.pod.cluster.local"
            records.append((namespace, address, [name], []))
            records.append((namespace, f"::ffff:{address}", [name], []))  # as a dual-stack listener sees a peer
    return records


def hosts_text(namespace: str, hostname: str, subdomain: str | None, ip: str | None, records: list[Record]) -> str:
    """A pod's /etc/hosts: itself, then ``records`` (its own namespace's short names too)."""
    own = f"{hostname}.{subdomain}.{namespace}.svc.cluster.local {hostname}" if subdomain else hostname
    lines = [
        "# Kubernetes-managed hosts file (atlas process node).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{ip}\t{own}",
    ]
    for record_namespace, address, names, short in records:
        shown = names + (short if record_namespace == namespace else [])
        lines.append(f"{address}\t{' '.join(shown)}")
    return "\n".join(lines) + "\n"
