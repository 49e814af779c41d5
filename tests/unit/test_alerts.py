"""The alert rules: one template in the chart (PrometheusRule) and the same rules as a plain file, both checked by
promtool; unit tests (`promtool test rules`) with series that must fire each alert and series that must not;
thresholds are chart values. (The rules against a real Prometheus and real runs: tests/training/test_prometheus.py.)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from atlas_cluster.helm_kubectl import ToolUnavailable, helm_binary
from tests.support.metric_names import expand, metric_names, operator_registries
from tests.support.prometheus_server import MISSING, binaries
from tools.alert_rules import render_alert_rules

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "atlas-alerts.rules.yaml"
UNIT_TESTS = REPO / "monitoring" / "atlas-alerts.test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"
ANNOTATIONS = {"summary", "description", "runbook", "runbook_url"}

needs_promtool = pytest.mark.skipif(binaries() is None, reason=MISSING)


@pytest.fixture(scope="module")
def helm():
    try:
        return helm_binary()
    except ToolUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc}")


def alerts_of(text: str) -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]}


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([binaries()[1], *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_the_plain_rules_file_is_the_charts_rules_at_their_defaults(helm):
    assert RULES.read_text() == render_alert_rules(), "monitoring/atlas-alerts.rules.yaml is stale: `make alert-rules`"


def test_every_alert_is_documented_and_labelled():
    alerts = alerts_of(RULES.read_text())
    assert set(alerts) == {
        "AtlasRunFailed",
        "AtlasRunStalled",
        "AtlasRewardCollapse",
        "AtlasKLBlowUp",
        "AtlasTeachingDegradationHigh",
        "AtlasRIMJudgeErrorsHigh",
        "AtlasOperatorDown",
        "AtlasOperatorReconcileErrors",
        "AtlasOperatorReconcileSlow",
    }
    headings = {m.lower() for m in re.findall(r"^## (\w+)", RUNBOOK.read_text(), re.M)}
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert set(rule["annotations"]) == ANNOTATIONS, name
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower() and anchor in headings, f"{name}: no section in docs/runbook.md"
        if rule["expr"].lstrip().startswith(("absent", "sum by (kind)", "histogram_quantile")):
            continue  # operator-wide alerts
        assert "$labels.run" in rule["annotations"]["description"], f"{name}: the description names no run"


def test_alert_expressions_name_only_exported_metrics():
    """Every metric an alert reads is one the trainer or the operator exports (or Prometheus' own `up`)."""
    from atlas_core.telemetry import metrics

    exported = expand([metrics.TRAINER_REGISTRY, *operator_registries()]) | {"up"}
    for name, rule in alerts_of(RULES.read_text()).items():
        names = metric_names(rule["expr"])
        assert names and names <= exported, f"{name}: {names - exported} not exported"


@needs_promtool
def test_promtool_checks_the_rules():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0 and "SUCCESS: 9 rules found" in checked.stdout, checked.stdout + checked.stderr


@needs_promtool
def test_promtool_unit_tests_pass():
    checked = promtool("test", "rules", str(UNIT_TESTS.relative_to(REPO)))
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def test_every_alert_has_series_that_fire_it_and_series_that_do_not():
    """In the unit tests each alert has an evaluation where it fires, and one where some of its input series are
    present and it must not (too early for its `for`, or below its threshold); every firing case also has series
    of other runs that stay silent."""
    fires, silent = set(), set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
            if check["exp_alerts"] and check["alertname"] != "AtlasOperatorDown":
                firing_runs = {(a["exp_labels"].get("run"), a["exp_labels"].get("kind")) for a in check["exp_alerts"]}
                inputs = {
                    (re.search(r'run="([^"]+)"', s["series"]) or re.search(r'kind="([^"]+)"', s["series"])).group(1)
                    for s in case["input_series"]
                }
                assert len(inputs) > len(firing_runs), f"{case['name']}: no series that must stay silent"
    alerts = set(alerts_of(RULES.read_text()))
    assert fires == alerts, alerts - fires
    assert silent == alerts, alerts - silent


@needs_promtool
def test_a_failing_expectation_fails_promtool(tmp_path):
    """The unit tests can fail: the same series, expecting the stalled run to be silent, is a failure."""
    cases = yaml.safe_load(UNIT_TESTS.read_text())
    stalled = next(c for c in cases["tests"] if c["alert_rule_test"][0]["alertname"] == "AtlasRunStalled")
    for check in stalled["alert_rule_test"]:
        check["exp_alerts"] = []
    (tmp_path / "atlas-alerts.rules.yaml").write_text(RULES.read_text())
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({**cases, "tests": [stalled]}))
    checked = promtool("test", "rules", "t.yaml", cwd=tmp_path)
    assert checked.returncode != 0 and "AtlasRunStalled" in checked.stdout + checked.stderr


# ----------------------------------------------------------------------------- the chart


def prometheus_rules(helm, *sets: str) -> list[dict]:
    args = [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(
        [str(helm), "template", "atlas", str(REPO / "charts/atlas-operator"), "--namespace", "atlas-system", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PrometheusRule"]


def test_the_prometheus_rule_is_off_by_default(helm):
    assert prometheus_rules(helm) == []
    (rule,) = prometheus_rules(helm, "alerts.prometheusRule.enabled=true", "alerts.prometheusRule.labels.release=kps")
    assert rule["metadata"]["labels"]["release"] == "kps" and rule["metadata"]["namespace"] == "atlas-system"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    # The ServiceMonitor's job: the operator's metrics Service.
    assert 'up{job="atlas-atlas-operator-metrics"}' in alerts["AtlasOperatorDown"]["expr"]


def test_thresholds_durations_and_labels_are_chart_values(helm, tmp_path):
    (rule,) = prometheus_rules(
        helm,
        "alerts.prometheusRule.enabled=true",
        "alerts.runStalled.noStepForSeconds=600",
        "alerts.runStalled.for=30s",
        "alerts.klBlowUp.threshold=2.5",
        "alerts.rewardCollapse.drop=0.1",
        "alerts.rewardCollapse.baseline=3h",
        "alerts.judgeErrors.ratio=0.25",
        "alerts.reconcileLatency.p95Seconds=3",
        "alerts.operatorJob=my-operator",
        "alerts.additionalLabels.team=ml-platform",
        "alerts.teachingDegradation.enabled=false",
    )
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "AtlasTeachingDegradationHigh" not in alerts and len(alerts) == 8
    assert alerts["AtlasRunStalled"]["expr"].endswith("> 600") and alerts["AtlasRunStalled"]["for"] == "30s"
    assert alerts["AtlasKLBlowUp"]["expr"].endswith("> 2.5")
    assert "[3h] offset 10m)) - 0.1" in alerts["AtlasRewardCollapse"]["expr"]
    assert alerts["AtlasRIMJudgeErrorsHigh"]["expr"].endswith("> 0.25")
    assert alerts["AtlasOperatorReconcileSlow"]["expr"].endswith("> 3")
    assert 'up{job="my-operator"}' in alerts["AtlasOperatorDown"]["expr"]
    assert all(r["labels"]["team"] == "ml-platform" for r in alerts.values())
    if binaries():
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
        checked = promtool("check", "rules", str(tmp_path / "rules.yaml"))
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_bad_threshold_values_are_refused_by_the_chart_schema(helm):
    proc = subprocess.run(
        [str(helm), "template", "atlas", str(REPO / "charts/atlas-operator"),
         "--set", "alerts.klBlowUp.threshold=-1", "--set", "alerts.runStalled.for=soon"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip  # a command line: each flag beside its value
    assert proc.returncode != 0
    assert "threshold" in proc.stderr and "for" in proc.stderr, proc.stderr
