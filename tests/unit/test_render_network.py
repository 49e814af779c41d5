"""The run's NetworkPolicies (atlas_operator.render.network), evaluated against the pods of both kinds and backends,
and the operator's network settings."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from atlas_operator.manifests import child_names, render_children
from atlas_operator.render import Images, NetworkSettings
from atlas_operator.validation import parse_run

from atlas_contract.names import OPERATOR_POD_LABELS, RENDEZVOUS_PORT, TRAINER_METRICS_PORT, VLLM_PORT, WEIGHT_SYNC_PORT
from harness import label_selectors
from harness.manifests import teacher, training
from tests.support.k8s_schemas import KUBE_VERSION
from tests.support.pod_policies import PodAt, ingress_allowed
from tests.support.render import BOTH_KINDS_AND_BACKENDS, pod_templates


def test_network_settings_of_the_operator():
    """ATLAS_NETWORK_POLICY (true/false; anything else refused naming it), ATLAS_MONITORING_NAMESPACE (empty: none),
    ATLAS_OPERATOR_NAMESPACE (the chart's downward API); flags win."""
    from atlas_operator.config import OperatorConfig

    default = OperatorConfig.from_env({}).network
    assert default == NetworkSettings(enabled=True, operator_namespace=None, monitoring_namespace="monitoring")
    chart = OperatorConfig.from_env(
        {"ATLAS_NETWORK_POLICY": "false", "ATLAS_MONITORING_NAMESPACE": "", "ATLAS_OPERATOR_NAMESPACE": "atlas-system"}
    ).network
    assert chart == NetworkSettings(enabled=False, operator_namespace="atlas-system", monitoring_namespace=None)
    with pytest.raises(SystemExit, match="ATLAS_NETWORK_POLICY: expected true or false, got 'maybe'"):
        OperatorConfig.from_env({"ATLAS_NETWORK_POLICY": "maybe"})
    flags = OperatorConfig.from_env({"ATLAS_NETWORK_POLICY": "true"}, network_policy=False, monitoring_namespace="prom")
    assert flags.network == NetworkSettings(enabled=False, monitoring_namespace="prom")


NETWORK = NetworkSettings(operator_namespace="atlas-system", monitoring_namespace="monitoring")


# The operator pod as the chart labels it (tests/unit/test_helm_chart.py checks the chart against OPERATOR_POD_LABELS).
OPERATOR_POD = PodAt("atlas-system", {**OPERATOR_POD_LABELS, "app.kubernetes.io/name": "atlas-operator"})


PROMETHEUS_POD = PodAt("monitoring", {"app.kubernetes.io/name": "prometheus"})


STRANGER_POD = PodAt("team-a", {"app": "notebook"})


NCCL_PORT = 40123  # NCCL's data and bootstrap sockets listen on ephemeral ports


def _controller_labels(obj: dict, component: str) -> dict[str, str]:
    """Labels the workload's controller adds to the pods it makes (none of our selectors rely on them)."""
    if obj["kind"] == "PyTorchJob":
        return {
            "training.kubeflow.org/job-name": obj["metadata"]["name"],
            "training.kubeflow.org/replica-type": "master",
        }
    if obj["kind"] == "JobSet":
        return {
            "jobset.sigs.k8s.io/jobset-name": obj["metadata"]["name"],
            "jobset.sigs.k8s.io/replicatedjob-name": component,
            "batch.kubernetes.io/job-completion-index": "0",
        }
    return {"pod-template-hash": "5d8f7c9b6"}


def run_pods_and_policies(manifest: dict, namespace: str | None = None) -> tuple[dict[str, PodAt], list[dict]]:
    """A run's pods as its controllers make them (component → pod: labels, named ports) and its NetworkPolicies."""
    manifest = copy.deepcopy(manifest)
    if namespace:
        manifest["metadata"]["namespace"] = namespace
    children = render_children(parse_run(manifest), Images(), network=NETWORK)
    pods = {}
    for obj in children:
        for template in pod_templates(obj):
            component = template["metadata"]["labels"]["app.kubernetes.io/component"]
            labels = {**template["metadata"]["labels"], **_controller_labels(obj, component)}
            ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            pods[component] = PodAt(manifest["metadata"]["namespace"], labels, ports)
    return pods, [c for c in children if c["kind"] == "NetworkPolicy"]


def _ports(component: str) -> list[int]:
    if component == "trainer":
        return [RENDEZVOUS_PORT, TRAINER_METRICS_PORT, NCCL_PORT]
    return [VLLM_PORT, NCCL_PORT] + ([WEIGHT_SYNC_PORT] if component == "rollout" else [])


@pytest.mark.parametrize("manifest", list(BOTH_KINDS_AND_BACKENDS.values()), ids=list(BOTH_KINDS_AND_BACKENDS))
def test_network_policies_let_only_the_runs_trainers_in(manifest):
    """Each rendered NetworkPolicy evaluated against the run's pods (ingress_allowed in
    tests/support/pod_policies.py): its servers and trainers accept only its own trainers (rendezvous, collectives,
    HTTP, weight sync); its trainers also accept its rollout server (NCCL connects both ways) and, on the metrics port
    only, the operator and the monitoring namespace. Another run's pods, a pod of another namespace with the very same
    labels, and any other pod are refused."""
    pods, policies = run_pods_and_policies(manifest)
    other_run, other_policies = run_pods_and_policies(
        {**manifest, "metadata": {**manifest["metadata"], "name": "other-run"}}
    )
    twin, twin_policies = run_pods_and_policies(manifest, namespace="team-b")
    everywhere = policies + other_policies + twin_policies
    assert {p["metadata"]["name"] for p in policies} == {
        f"{manifest['metadata']['name']}-network",
        f"{manifest['metadata']['name']}-network-trainer",
    }
    sources = {f"run {c}": pod for c, pod in pods.items()}
    sources |= {f"other run {c}": pod for c, pod in other_run.items()}
    sources |= {f"team-b twin {c}": pod for c, pod in twin.items()}
    sources |= {"operator": OPERATOR_POD, "prometheus": PROMETHEUS_POD, "stranger": STRANGER_POD}
    assert {"trainer", "rollout"} <= set(pods)

    def expected(source: str, target: str, port: int) -> bool:
        if source == "run trainer":
            return True
        if target == "trainer" and source == "run rollout":
            return True
        return target == "trainer" and port == TRAINER_METRICS_PORT and source in ("operator", "prometheus")

    for target, target_pod in pods.items():
        for port in _ports(target):
            for source, source_pod in sources.items():
                allowed = ingress_allowed(everywhere, source_pod, target_pod, port)
                assert allowed is expected(source, target, port), f"{source} → run {target}:{port}"
    # The policies of the run select none of the other pods: those stay as their own policies say.
    for pod in [*other_run.values(), *twin.values(), OPERATOR_POD, PROMETHEUS_POD, STRANGER_POD]:
        assert ingress_allowed(policies, STRANGER_POD, pod, VLLM_PORT)


def test_the_network_policy_evaluator_follows_the_api_semantics():
    """The evaluator itself (kubernetes.io/docs/concepts/services-networking/network-policies): not isolated without
    a selecting Ingress policy; an empty ingress list admits nothing; namespaceSelector and podSelector in one peer
    AND, in two peers OR; podSelector alone means the policy's namespace; named ports and endPort; matchExpressions."""

    def policy(pod_selector, ingress, namespace="a", types=("Ingress",)):
        return {
            "metadata": {"namespace": namespace},
            "spec": {"podSelector": pod_selector, "policyTypes": list(types), "ingress": ingress},
        }

    target = PodAt("a", {"app": "db"}, {"sql": 5432})
    web_a, web_b, db_b = PodAt("a", {"app": "web"}), PodAt("b", {"app": "web"}), PodAt("b", {"app": "db"})
    assert ingress_allowed([], web_b, target, 5432)
    assert ingress_allowed([policy({}, [], namespace="b")], web_b, target, 5432)  # another namespace's policy
    assert ingress_allowed([policy({}, [], types=("Egress",))], web_b, target, 5432)
    assert not ingress_allowed([policy({}, [])], web_a, target, 5432)  # selected, nothing admitted
    assert ingress_allowed([policy({}, [{}])], web_b, target, 1)  # one empty rule: everyone, every port
    only_web = [policy({"matchLabels": {"app": "db"}}, [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}])]
    assert ingress_allowed(only_web, web_a, target, 5432) and not ingress_allowed(only_web, web_b, target, 5432)
    ns_b = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}
    web = {"podSelector": {"matchLabels": {"app": "web"}}}
    both = [policy({}, [{"from": [{**ns_b, **web}]}])]
    either = [policy({}, [{"from": [ns_b, web]}])]
    assert ingress_allowed(both, web_b, target, 1) and not ingress_allowed(both, db_b, target, 1)
    assert not ingress_allowed(both, web_a, target, 1)
    assert ingress_allowed(either, db_b, target, 1) and ingress_allowed(either, web_a, target, 1)
    ports = [policy({}, [{"ports": [{"port": "sql"}, {"protocol": "TCP", "port": 8000, "endPort": 8010}]}])]
    assert ingress_allowed(ports, web_b, target, 5432) and ingress_allowed(ports, web_b, target, 8005)
    assert not ingress_allowed(ports, web_b, target, 8011) and not ingress_allowed(ports, web_b, target, 5432, "UDP")
    expressions = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}
    assert ingress_allowed([policy({}, [{"from": [{"podSelector": expressions}]}])], web_a, target, 1)
    assert not label_selectors.matches({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": "x"})
    assert label_selectors.matches({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, {})


def test_network_policies_follow_the_operator_settings():
    """Off: no NetworkPolicy and none in status.children. No monitoring namespace: only the operator scrapes. Not in
    a cluster (no operator namespace): only the monitoring namespace does. Every policy is the run's child."""
    run = parse_run(teacher())
    off = render_children(run, network=NetworkSettings(enabled=False))
    assert not [c for c in off if c["kind"] == "NetworkPolicy"]
    assert "networkPolicy" not in child_names(run, network=False)
    pods, policies = run_pods_and_policies(teacher())
    no_monitoring = [
        c
        for c in render_children(
            run, network=NetworkSettings(operator_namespace="atlas-system", monitoring_namespace=None)
        )
        if c["kind"] == "NetworkPolicy"
    ]
    assert ingress_allowed(no_monitoring, OPERATOR_POD, pods["trainer"], TRAINER_METRICS_PORT)
    assert not ingress_allowed(no_monitoring, PROMETHEUS_POD, pods["trainer"], TRAINER_METRICS_PORT)
    outside = [c for c in render_children(run) if c["kind"] == "NetworkPolicy"]  # NetworkSettings() defaults
    assert ingress_allowed(outside, PROMETHEUS_POD, pods["trainer"], TRAINER_METRICS_PORT)
    assert not ingress_allowed(outside, OPERATOR_POD, pods["trainer"], TRAINER_METRICS_PORT)
    for policy in policies:
        kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
        assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "atlas-operator"
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: model hubs, judges, DNS


def test_a_run_without_servers_still_isolates_its_trainers():
    pods, policies = run_pods_and_policies(training(rollout={"replicas": 0}))
    assert set(pods) == {"trainer"}
    assert ingress_allowed(policies, pods["trainer"], pods["trainer"], RENDEZVOUS_PORT)
    assert not ingress_allowed(policies, STRANGER_POD, pods["trainer"], RENDEZVOUS_PORT)
    assert ingress_allowed(policies, OPERATOR_POD, pods["trainer"], TRAINER_METRICS_PORT)
