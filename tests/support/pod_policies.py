"""What a cluster enforces on the rendered pods, evaluated here: the restricted Pod Security Standard (every baseline
and restricted control) and NetworkPolicy ingress (selectors, namespace selectors, ports, policy types)."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness import label_selectors

# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the restricted profile includes baseline).
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


BASELINE_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
BASELINE_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_profile_problems(pod_spec: dict[str, Any]) -> list[str]:
    """What the Pod Security admission would refuse in ``pod_spec`` (a PodSpec) at level ``restricted``: every
    baseline and restricted control of the Pod Security Standards, as the documentation states them; [] when the
    pod is admitted. Container-level fields are checked on containers, initContainers and ephemeralContainers."""
    problems: list[str] = []
    pod_context = pod_spec.get("securityContext") or {}
    containers = [
        (kind, c) for kind in ("containers", "initContainers", "ephemeralContainers") for c in pod_spec.get(kind) or []
    ]
    # baseline: HostProcess
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("securityContext.windowsOptions.hostProcess: must be unset or false")
    # baseline: host namespaces
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"{field}: must be unset or false")
    # baseline: hostPath volumes; restricted: volume types
    for volume in pod_spec.get("volumes") or []:
        types = set(volume) - {"name"}
        if "hostPath" in types:
            problems.append(f"volumes[{volume['name']}]: hostPath is forbidden")
        if not types <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volumes[{volume['name']}]: type {sorted(types - RESTRICTED_VOLUME_TYPES)} not allowed")
    # baseline: sysctls
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in BASELINE_SAFE_SYSCTLS:
            problems.append(f"securityContext.sysctls: {sysctl.get('name')} is not a safe sysctl")
    # baseline: AppArmor, SELinux, seccomp (not Unconfined) at pod level
    problems += _context_problems(pod_context, "securityContext")
    # restricted: running as non-root (pod level, or every container), seccomp RuntimeDefault/Localhost likewise
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_context.get("runAsUser") == 0:
        problems.append("securityContext.runAsUser: must not be 0")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append(f"securityContext.seccompProfile.type: {pod_seccomp}, expected RuntimeDefault or Localhost")
    for kind, container in containers:
        where = f"{kind}[{container.get('name')}]"
        context = container.get("securityContext") or {}
        problems += _context_problems(context, f"{where}.securityContext")
        if kind != "ephemeralContainers":
            for port in container.get("ports") or []:
                if port.get("hostPort"):
                    problems.append(f"{where}.ports: hostPort {port['hostPort']} is forbidden")
        if context.get("privileged"):
            problems.append(f"{where}.securityContext.privileged: must be unset or false")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess: must be unset or false")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{where}.securityContext.procMount: must be Default")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation: must be false")
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            problems.append(f"{where}: runAsNonRoot must be true (on the pod or the container)")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser: must not be 0")
        seccomp = (context.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (pod or container)")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop: must include ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{where}.securityContext.capabilities.add: only NET_BIND_SERVICE, got {sorted(added)}")
    return problems


def _context_problems(context: dict[str, Any], where: str) -> list[str]:
    """Baseline's AppArmor, SELinux and seccomp controls for one securityContext (pod or container)."""
    problems = []
    apparmor = (context.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in ("RuntimeDefault", "Localhost"):
        problems.append(f"{where}.appArmorProfile.type: {apparmor} is not allowed")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in BASELINE_SELINUX_TYPES:
        problems.append(f"{where}.seLinuxOptions.type: {selinux['type']} is not allowed")
    for field in ("user", "role"):
        if selinux.get(field):
            problems.append(f"{where}.seLinuxOptions.{field}: must be unset")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append(f"{where}.seccompProfile.type: Unconfined is forbidden")
    return problems


@dataclasses.dataclass(frozen=True)
class PodAt:
    """A pod as NetworkPolicy sees it: its namespace (and that namespace's labels), labels and named ports."""

    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = dataclasses.field(default_factory=dict)  # container port name → number

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}  # what the API server sets on every namespace


def _policy_types(spec: dict[str, Any]) -> list[str]:
    """spec.policyTypes, defaulted as the API server does: Ingress always, Egress when egress rules exist."""
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))


def _peer_matches(peer: dict[str, Any], policy_namespace: str, source: PodAt) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod traffic is judged by selectors here; no policy of ours uses ipBlock
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None:  # podSelector alone: pods of the policy's own namespace
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = label_selectors.matches(namespaces, source.namespace_labels)
    return in_namespace and label_selectors.matches(pods, source.labels)


def _port_matches(ports: list[dict[str, Any]] | None, port: int, protocol: str, target: PodAt) -> bool:
    if not ports:
        return True  # no ports: every port
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        number = target.ports.get(wanted) if isinstance(wanted, str) else wanted
        if number is not None and number <= port <= entry.get("endPort", number):
            return True
    return False


def ingress_allowed(
    policies: list[dict[str, Any]], source: PodAt, target: PodAt, port: int, protocol: str = "TCP"
) -> bool:
    """Whether NetworkPolicies ``policies`` let ``source`` open a connection to ``target``'s ``port``: a pod is
    isolated for ingress when any policy of its namespace selects it with policy type Ingress; then a connection is
    allowed when any such policy has a rule whose ``from`` (absent or empty: everyone) and ``ports`` (absent or
    empty: all) both match. Egress is not modelled (our policies have none)."""
    applicable = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and "Ingress" in _policy_types(p["spec"])
        and label_selectors.matches(p["spec"].get("podSelector"), target.labels)
    ]
    if not applicable:
        return True
    for policy in applicable:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            sources_ok = not peers or any(_peer_matches(p, policy["metadata"]["namespace"], source) for p in peers)
            if sources_ok and _port_matches(rule.get("ports"), port, protocol, target):
                return True
    return False
