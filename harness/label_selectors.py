"""The tests' one label-selector matcher (k8s.io/apimachinery/pkg/labels): a metav1.LabelSelector (matchLabels and
matchExpressions: In, NotIn, Exists, DoesNotExist) held against labels, and the query-string form a list or watch
sends (``labelSelector=``) parsed into one. A Service's selector is a plain map: ``{"matchLabels": selector}``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_TERM = re.compile(
    r"\s*(?:(?P<absent>!)\s*(?P<akey>[\w./-]+)"
    r"|(?P<skey>[\w./-]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*))?)\s*(?:,|$)"
)


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether every requirement of ``selector`` holds for ``labels``; an empty selector matches everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
        if (
            (operator == "In" and not (present and labels[key] in values))
            or (operator == "NotIn" and present and labels[key] in values)
            or (operator == "Exists" and not present)
            or (operator == "DoesNotExist" and present)
        ):
            return False
    return True


def parse(text: str) -> dict[str, Any]:
    """A query-string selector as a LabelSelector: ``k=v`` and ``k==v`` (In), ``k!=v`` (NotIn: true where ``k`` is
    absent), ``k`` (Exists), ``!k`` (DoesNotExist), ``k in (a,b)``, ``k notin (a,b)``, all ANDed. ValueError when it
    does not parse (the API server's 400)."""
    expressions: list[dict[str, Any]] = []
    position = 0
    while position < len(text):
        match = _TERM.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"unable to parse requirement: {text[position:]!r}")
        position = match.end()
        if match["absent"]:
            expressions.append({"key": match["akey"], "operator": "DoesNotExist"})
        elif match["setop"]:
            values = [v.strip() for v in match["values"].split(",")]
            expressions.append(
                {"key": match["skey"], "operator": "In" if match["setop"] == "in" else "NotIn", "values": values}
            )
        elif match["op"]:
            operator = "NotIn" if match["op"] == "!=" else "In"
            expressions.append({"key": match["key"], "operator": operator, "values": [match["value"]]})
        else:
            expressions.append({"key": match["key"], "operator": "Exists"})
    return {"matchExpressions": expressions}
