"""The run's NetworkPolicies: only its trainers reach its servers and each other; metrics from the operator
and the monitoring namespace."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    OPERATOR_POD_LABELS,
    TRAINER_METRICS_PORT,
    ChildNames,
)
from atlas_operator.config import NetworkSettings
from atlas_operator.render.metadata import child_metadata
from atlas_operator.spec import Run


def _run_pods(run: Run, component: str | None = None) -> dict[str, Any]:
    """A selector of the run's pods (of one component): the managed-by label keeps another app's pods that share
    app.kubernetes.io/instance (a Helm release of the same name) out. Both backends' pods carry these labels."""
    selected = {LABEL_INSTANCE: run.name, LABEL_MANAGED_BY: MANAGED_BY}
    if component:
        selected[LABEL_COMPONENT] = component
    return {"matchLabels": selected}


def _namespace(name: str) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": name}}  # set on every namespace by the API server


def _ingress_policy(run: Run, name: str, pods: dict[str, Any], rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(run, name, "trainer"),
        # Ingress only: trainers and servers still reach model hubs, judges and DNS.
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": rules},
    }


def network_policies(run: Run, network: NetworkSettings) -> list[dict[str, Any]]:
    """``<name>-network``: every pod of the run accepts traffic only from the run's trainer pods (their rendezvous
    and collectives, and their calls to the servers: HTTP and the weight-sync NCCL group). ``<name>-network-trainer``:
    the trainer pods also accept the rollout server's side of that NCCL group (NCCL connects both ways, on ports of
    its own choosing) and, on the metrics port only, the operator and the monitoring namespace. Needs a CNI that
    enforces NetworkPolicy; kubelet probes come from the node, which such CNIs allow."""
    if not network.enabled:
        return []
    owned = ChildNames(run.name)
    trainer_rules: list[dict[str, Any]] = []
    if run.spec.rollout.replicas:  # a rollout server
        trainer_rules.append({"from": [{"podSelector": _run_pods(run, "rollout")}]})
    scrapers = []
    if network.operator_namespace:
        scrapers.append(
            {
                "namespaceSelector": _namespace(network.operator_namespace),
                "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
            }
        )
    if network.monitoring_namespace:
        scrapers.append({"namespaceSelector": _namespace(network.monitoring_namespace)})
    if scrapers:
        trainer_rules.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": TRAINER_METRICS_PORT}]})
    return [
        _ingress_policy(
            run, owned.network_policy, _run_pods(run), [{"from": [{"podSelector": _run_pods(run, "trainer")}]}]
        ),
        _ingress_policy(run, owned.trainer_network_policy, _run_pods(run, "trainer"), trainer_rules),
    ]
