"""The metric names in PromQL (dashboards, alert rules) and the names our prometheus_client registries export."""

from __future__ import annotations

import importlib
import re

PROMQL_WORDS = {
    # aggregations, functions and keywords: identifiers that are not metric names
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "group",
    "count_values",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "histogram_quantile",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "sum_over_time",
    "last_over_time",
    "abs",
    "clamp_min",
    "clamp_max",
    "label_replace",
    "vector",
    "scalar",
    "time",
    "timestamp",
    "absent",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left after stripping strings, label
    matchers, range selectors, grouping clauses, numbers and function calls."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    s = re.sub(r"\{[^{}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range/subquery selectors
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = s.replace("$__rate_interval", " ").replace("$__interval", " ")
    names = set()
    for m in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in PROMQL_WORDS:
            continue
        names.add(ident)
    return names


def expand(registries) -> set[str]:
    """Sample names prometheus_client exposes for the metric families in ``registries``."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "summary": ("", "_sum", "_count", "_created"),
        "info": ("_info",),
        "stateset": ("",),
        "gauge": ("",),
        "unknown": ("",),
    }
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + sfx for sfx in suffixes[family.type])
    return names


def operator_registries():
    """The operator's registries. atlas_operator is part of this package: an import error is a failure."""
    from prometheus_client import CollectorRegistry

    module = importlib.import_module("atlas_operator.metrics")
    registries = [v for v in vars(module).values() if isinstance(v, CollectorRegistry)]
    assert registries, "atlas_operator.metrics defines no CollectorRegistry to enumerate"
    return registries
