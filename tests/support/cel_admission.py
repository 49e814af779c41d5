"""The API server's admission of a custom resource, as far as the CRDs' CEL rules go, read from the generated
CRD files (not from the operator's rule registry): structural defaulting, then every ``x-kubernetes-validations``
rule evaluated where it sits in the schema, ``self`` bound to the value there and, for a transition rule on an
update, ``oldSelf`` to the old value at the same place. A rule on list items runs once per item; a rule whose
object is unset does not run; a transition rule runs only when the old object has the value too. A refusal's message
is its ``messageExpression``'s value (the static ``message`` where that fails, is not a string, is blank or has a line
break), and its field the rule's place plus its ``fieldPath``: the cause of the API server's 422.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cel_expr_python import cel

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``kind``'s CRD as shipped in crds/ (shared: copy it to change it)."""
    (path,) = (
        p for p in (REPO / "crds").glob("*.yaml") if yaml.safe_load(p.read_text())["spec"]["names"]["kind"] == kind
    )
    return yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def defaulted(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` with the schema's defaults applied where a field is unset, as the API server stores it."""
    value = copy.deepcopy(value)
    _default(value, schema)
    return value


def _default(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, prop in (schema.get("properties") or {}).items():
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                _default(value[key], prop)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default(item, schema["items"])


@dataclass(frozen=True)
class Refusal:
    """One failed rule: where the API server reports it (the rule's place plus its fieldPath) and its message."""

    path: str
    message: str
    rule: str

    def as_problem(self) -> str:
        """The refusal as the operator words a problem: ``<field>: <message>``."""
        return f"{self.path}: {self.message}"


@functools.cache
def _program(expression: str) -> Any:
    env = cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN})
    return env.compile(expression)


def is_transition(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


def admission_refusals(
    obj: dict[str, Any], old: dict[str, Any] | None = None, schema: dict | None = None
) -> list[Refusal]:
    """Every CEL rule the API server would find broken by creating ``obj`` (or updating ``old`` to it)."""
    schema = schema or crd_schema(obj["kind"])
    new = defaulted(obj, schema)
    before = defaulted(old, schema) if old is not None else None
    found: list[Refusal] = []
    _walk(new, before, schema, "", found)
    return found


def _message(validation: dict[str, str], data: dict[str, Any]) -> str:
    try:
        text = _program(validation["messageExpression"]).eval(data=data).value()
    except Exception:  # noqa: BLE001 - Kubernetes falls back to the static message
        return validation["message"]
    return text if isinstance(text, str) and text.strip() and "\n" not in text else validation["message"]


def _walk(value: Any, old: Any, schema: dict[str, Any], path: str, found: list[Refusal]) -> None:
    for validation in schema.get("x-kubernetes-validations") or []:
        rule = validation["rule"]
        if is_transition(rule) and old is None:
            continue
        data = {"self": value, "oldSelf": old}
        result = _program(rule).eval(data=data).value()
        if result is not True:
            where = (path + validation.get("fieldPath", "")).lstrip(".")
            message = _message(validation, data) if result is False else f"error {result}"
            found.append(Refusal(where, message, rule))
    if isinstance(value, dict):
        for key, prop in (schema.get("properties") or {}).items():
            if key in value:
                before = old.get(key) if isinstance(old, dict) else None
                _walk(value[key], before, prop, f"{path}.{key}" if path else key, found)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):  # atomic lists: no item has an old self
            _walk(item, None, schema["items"], f"{path}[{index}]", found)
