"""The process node's pod network: a Linux bridge on the host, one network namespace per pod joined to it by a veth
pair, pod IPs from a private /16 (node ``i`` hands out ``10.X.(i+1).2-254``, its ``spec.podCIDR``), and names
resolved from a hosts file per pod (``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts`` and ``resolv.conf``
over ``/etc``'s).

What a pod sees: ``eth0`` with its pod IP, ``lo``, a default route via the bridge; every other pod on every node
of this host at its pod IP (one bridge, one L2 segment: no routing, no NAT, no outside world — nor the API server,
which listens on the host's 127.0.0.1). The host reaches every pod IP through the bridge (the operator's metrics
scrape of ``<pod-ip>:9400`` works). Two pods may both listen on the same port.

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's ``ip``. Every name made here carries the network's
prefix and is recorded in ``<state>/network.json``, so a later start in the same folder removes what a killed
run left behind, and nothing else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"  # nothing listens there: fails at once


class NetworkError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def available() -> str | None:
    """None when this host can make pod networks, else why not."""
    if not shutil.which("ip"):
        return "no `ip` (iproute2) on PATH"
    probe = f"atlprobe{os.getpid() % 10**7}"  # unique: two nodes may start at once
    done = ip("link", "add", probe, "type", "bridge", check=False)
    if done.returncode != 0:
        return f"cannot create a bridge: {done.stderr.strip()} (root and CAP_NET_ADMIN needed)"
    ip("link", "del", probe, check=False)
    return None


def _routes() -> str:
    return ip("-4", "route", "show", check=False).stdout


def pick_cidr(preferred: int = 244) -> ipaddress.IPv4Network:
    """``10.X.0.0/16`` not yet routed on this host, ``X`` = ``preferred`` if free."""
    routes = _routes()
    for second in [preferred, *range(200, 255)]:
        net = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        if str(net) not in routes:
            return net
    raise NetworkError("no free 10.X.0.0/16 for the pod network")


def rewrite_in_place(path: Path, text: str) -> None:
    """Rewrite ``path`` keeping its inode: a bind mount of it (a pod's /etc/hosts, the host view's) sees it."""
    with contextlib.suppress(OSError):
        if path.read_text() != text:
            with open(path, "r+") as f:
                f.write(text)
                f.truncate()


# ---------------------------------------------------------------------- the host's view of cluster names
# A program on the host (the operator, run beside the local cluster as controllers run out of cluster) reaches every
# pod IP through the bridge but resolves no cluster name: there is no cluster DNS. The nodes keep a hosts file of the
# cluster's names (the host's /etc/hosts, then every Service's and pod's record, qualified names only), and
# ``with_cluster_names`` runs a program in a mount namespace of its own whose /etc/hosts is that file — what
# ``ip netns exec`` does for a pod. The program's own process: its pid is the one a supervisor records.

HOST_HOSTS = "hosts"  # in the cluster's folder


def host_hosts_file(cluster_dir: Path) -> Path:
    return Path(cluster_dir) / HOST_HOSTS


def host_hosts_base() -> str:
    """The host's own /etc/hosts, which the host view begins with (read once: the nodes rewrite the view often)."""
    return Path("/etc/hosts").read_text() if Path("/etc/hosts").is_file() else "127.0.0.1 localhost\n"


def host_hosts_text(base: str, records: list[tuple[str, str, list[str], list[str]]]) -> str:
    lines = [base.rstrip("\n"), "# the local cluster's names (atlas process nodes)"]
    lines += [f"{address}\t{' '.join(names)}" for _, address, names, _ in records]
    return "\n".join(lines) + "\n"


def with_cluster_names(cluster_dir: Path, command: list[str]) -> list[str]:
    """``command`` resolving the local cluster's names when its nodes keep them (else unchanged)."""
    hosts = host_hosts_file(cluster_dir)
    if not hosts.is_file() or not shutil.which("unshare"):
        return command
    mount = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, str(hosts), *command]


class PodNetwork:
    """The bridge ``<prefix>br`` with one host address per node (``10.X.0.(i+1)``: the nodes' InternalIPs), and the
    pods' namespaces ``<prefix>-<a>-<b>`` (pod IP ``10.X.a.b``)."""

    def __init__(self, state_dir: Path, prefix: str = "atlas", cidr: str | None = None, nodes: int = 1):
        self.state_dir = state_dir
        self.prefix = prefix
        self.bridge = f"{prefix}br"[:15]
        self.cidr = ipaddress.IPv4Network(cidr) if cidr else None
        self.nodes = nodes
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}  # node → last host number handed out
        self._used: set[str] = set()

    @property
    def state_file(self) -> Path:
        return self.state_dir / "network.json"

    # ------------------------------------------------------------------ the bridge

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The pods' /16: given, or picked by ``start``."""
        assert self.cidr is not None, "not started"
        return self.cidr

    def node_ip(self, node: int) -> str:
        return str(self.network.network_address + node + 1)

    @property
    def gateway(self) -> str:
        return self.node_ip(0)

    def pod_cidr(self, node: int) -> str:
        base = int(self.network.network_address) + ((node + 1) << 8)
        return str(ipaddress.IPv4Network((base, 24)))

    def start(self) -> PodNetwork:
        self.cleanup_recorded()
        if ip("link", "show", self.bridge, check=False).returncode == 0:
            raise NetworkError(f"bridge {self.bridge} exists already (another node network on this host?)")
        if self.cidr is None:
            self.cidr = pick_cidr()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({"bridge": self.bridge, "prefix": self.prefix, "cidr": str(self.cidr)}))
        ip("link", "add", self.bridge, "type", "bridge")
        for node in range(self.nodes):
            ip("addr", "add", f"{self.node_ip(node)}/{self.cidr.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        return self

    def stop(self) -> None:
        self.cleanup_recorded()

    def cleanup_recorded(self) -> None:
        """Remove the bridge, namespaces, veths and /etc/netns folders a run in ``state_dir`` made."""
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return
        prefix = state["prefix"] + "-"
        for line in ip("netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(prefix):
                self._delete_netns(name)
        for folder in NETNS_ETC.glob(prefix + "*") if NETNS_ETC.is_dir() else []:
            shutil.rmtree(folder, ignore_errors=True)
        ip("link", "del", state["bridge"], check=False)
        self.state_file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only when empty: another network's folders stay

    # ------------------------------------------------------------------ pods

    def allocate(self, node: int) -> str:
        """A free pod IP of ``node``'s /24 (handed out round-robin, so an IP is not reused at once)."""
        subnet = ipaddress.IPv4Network(self.pod_cidr(node))
        with self._lock:
            last = self._next.get(node, 1)
            for step in range(1, 254):
                host = (last - 1 + step) % 253 + 2  # 2..254
                address = str(subnet.network_address + host)
                if address not in self._used:
                    self._used.add(address)
                    self._next[node] = host
                    return address
        raise NetworkError(f"no free pod IP on node {node}")

    def netns_name(self, pod_ip: str) -> str:
        _, _, c, d = pod_ip.split(".")
        return f"{self.prefix}-{c}-{d}"

    def add_pod(self, pod_ip: str) -> str:
        """The pod's namespace, wired to the bridge at ``pod_ip``; returns its name."""
        ns = self.netns_name(pod_ip)
        _, _, c, d = pod_ip.split(".")
        host_veth = f"{self.prefix[:9]}{int(c):02x}{int(d):02x}v"  # at most 15 characters
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        (NETNS_ETC / ns / "resolv.conf").write_text(RESOLV_CONF)
        hosts = NETNS_ETC / ns / "hosts"
        if not hosts.exists():
            hosts.write_text(f"127.0.0.1 localhost\n{pod_ip} {ns}\n")
        self._delete_netns(ns)
        ip("netns", "add", ns)
        ip("link", "del", host_veth, check=False)
        ip("link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", host_veth, "master", self.bridge)
        ip("link", "set", host_veth, "up")
        ip("-n", ns, "addr", "add", f"{pod_ip}/{self.network.prefixlen}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "route", "add", "default", "via", self.gateway)
        return ns

    def hosts_file(self, pod_ip: str) -> Path:
        return NETNS_ETC / self.netns_name(pod_ip) / "hosts"

    def write_hosts(self, pod_ip: str, text: str) -> None:
        """Rewrite the pod's hosts file in place (the pod's /etc/hosts is a bind mount of this very inode)."""
        path = self.hosts_file(pod_ip)
        if path.parent.is_dir():
            rewrite_in_place(path, text)

    def remove_pod(self, pod_ip: str) -> None:
        ns = self.netns_name(pod_ip)
        self._delete_netns(ns)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        with self._lock:
            self._used.discard(pod_ip)

    def _delete_netns(self, ns: str) -> None:
        # Deleting the namespace deletes its veth end, and with it the peer on the bridge.
        ip("netns", "del", ns, check=False)

    def exec_prefix(self, pod_ip: str) -> list[str]:
        """argv prefix that runs a command in the pod's network (and its /etc/hosts, /etc/resolv.conf)."""
        return ["ip", "netns", "exec", self.netns_name(pod_ip)]
