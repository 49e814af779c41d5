"""Typed spec models → OpenAPI v3 schema and a parser that reports every problem.

The run specs (:mod:`atlas_operator.spec`) are plain dataclasses whose fields carry their
documentation and constraints in ``metadata``; this module turns them into the CRD's
``openAPIV3Schema`` and parses a manifest's ``spec`` into them. Python names are snake_case,
the API's are camelCase (``per_device_train_batch_size`` ↔ ``perDeviceTrainBatchSize``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from atlas_contract.text import bounded_repr

REQUIRED = "required"
INT64 = (-(2**63), 2**63 - 1)
BOUND_KEYWORDS = {"max_length": "maxLength", "max_items": "maxItems", "max_properties": "maxProperties"}


def spec_field(
    doc: str,
    default: Any = None,
    *,
    required: bool = False,
    trainer_default: bool = False,
    unset: str | None = None,
    enum: tuple[Any, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    pattern: str | None = None,
    pattern_doc: str | None = None,
    max_length: int | None = None,
    max_items: int | None = None,
    item_max_length: int | None = None,
    max_properties: int | None = None,
) -> Any:
    """A documented field. The description's default is generated, never written by hand:

    - ``default``: the value an unset field gets (the CRD's ``default``, applied by the API server and
      by :func:`parse`);
    - ``trainer_default``: the field stays unset in the object and the operator writes the default of
      :mod:`atlas_contract.defaults` for the run's algorithm into run.yaml;
    - ``unset``: what leaving the field unset means when no single value applies.

    ``max_length`` (a string), ``max_items`` and ``item_max_length`` (a list, of strings) and ``max_properties``
    (a map) bound the field: the API server prices a CEL rule by the largest value it may read
    (atlas_operator/cel_rules.py), so every field a rule reads is bounded.
    """
    metadata = {
        "doc": doc,
        REQUIRED: required,
        "trainer_default": trainer_default,
        "unset": unset,
        "enum": enum,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "exclusive_maximum": exclusive_maximum,
        "pattern": pattern,
        "pattern_doc": pattern_doc,  # what the pattern means, for error messages
        "max_length": max_length,
        "max_items": max_items,
        "item_max_length": item_max_length,
        "max_properties": max_properties,
    }
    if isinstance(default, (list, dict)) or (isinstance(default, type) and dataclasses.is_dataclass(default)):
        factory = default if isinstance(default, type) else (lambda d=default: type(d)(d))
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def description(f: dataclasses.Field[Any]) -> str:
    """The field's documentation with the default that applies and its size bound (what ``kubectl explain``
    shows)."""
    bound = _bound_doc(f.metadata)
    return f"{_description(f)}{' ' + bound if bound else ''}"


def _bound_doc(meta: Mapping[str, Any]) -> str:
    parts = [
        f"{what} {meta[key]} {unit}"
        for key, what, unit in (
            ("max_length", "at most", "characters"),
            ("max_items", "at most", "items"),
            ("item_max_length", "each at most", "characters"),
            ("max_properties", "at most", "entries"),
        )
        if meta.get(key) is not None
    ]
    return f"Bound: {', '.join(parts)}." if parts else ""


def _description(f: dataclasses.Field[Any]) -> str:
    from atlas_contract.defaults import describe_training_default

    meta = f.metadata
    text: str = meta["doc"]
    default = default_of(f)
    if meta.get("trainer_default"):
        return f"{text}. {describe_training_default(f.name)}"
    if default is not None and not dataclasses.is_dataclass(default):
        return f"{text}. Default: {_literal(default)}."
    if meta.get("unset"):
        return f"{text}. Unset: {meta['unset']}."
    if _is_empty_factory(f):
        return f"{text}. Default: empty."
    return text


def _is_empty_factory(f: dataclasses.Field[Any]) -> bool:
    if f.default_factory is dataclasses.MISSING:
        return False
    value = f.default_factory()
    return value in ([], {})


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):  # as YAML writes it: [all-linear]
        return "[" + ", ".join(map(_literal, value)) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


@functools.cache  # field names only (a bounded set), asked for on every parse of every run
def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a spec dataclass, once per class (resolving them is most of a parse's time)."""
    return typing.get_type_hints(cls)


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


# --------------------------------------------------------------------------- schema


def openapi_schema(cls: type) -> dict[str, Any]:
    """The OpenAPI v3 (structural) schema of a spec dataclass."""
    hints = _type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        prop = _type_schema(unwrap_optional(hints[f.name]))
        prop["description"] = description(f)
        for key, schema_key in (
            ("enum", "enum"),
            ("minimum", "minimum"),
            ("maximum", "maximum"),
            ("pattern", "pattern"),
        ):
            if meta.get(key) is not None:
                prop[schema_key] = list(meta[key]) if key == "enum" else meta[key]
        if meta.get("pattern"):  # OpenAPI patterns match anywhere in the value: anchor it, as parse() does
            prop["pattern"] = f"^(?:{meta['pattern']})$"
        if meta.get("exclusive_minimum"):
            prop["exclusiveMinimum"] = True
        if meta.get("exclusive_maximum"):
            prop["exclusiveMaximum"] = True
        for key, schema_key in BOUND_KEYWORDS.items():
            if meta.get(key) is not None:
                prop[schema_key] = meta[key]
        if meta.get("item_max_length") is not None:
            prop["items"]["maxLength"] = meta["item_max_length"]
        if meta.get("enum") is not None and prop.get("type") == "string":  # bounded for CEL's cost estimate
            prop.setdefault("maxLength", max(len(v) for v in meta["enum"]))
        default = default_of(f)
        if default is not None and not dataclasses.is_dataclass(default):
            prop["default"] = default
        if meta.get(REQUIRED):
            required.append(camel(f.name))
        properties[camel(f.name)] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    return schema


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return value if value not in ([], {}) else None
    return None


def _is_dataclass_type(annotation: Any) -> typing.TypeGuard[type[Any]]:
    """A field's type that is a dataclass (an annotation is a class, never an instance)."""
    return dataclasses.is_dataclass(annotation)


def _type_schema(annotation: Any) -> dict[str, Any]:
    if _is_dataclass_type(annotation):
        schema = openapi_schema(annotation)
        schema.pop("description", None)
        return schema
    origin = typing.get_origin(annotation)
    if annotation is str:
        return {"type": "string"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if origin is list:
        (item,) = typing.get_args(annotation)
        return {"type": "array", "items": _type_schema(item)}
    if origin is dict:
        _, value = typing.get_args(annotation)
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": _type_schema(value)}
    if annotation is Any or annotation is dict:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    raise TypeError(f"no schema for {annotation!r}")


def to_object(value: Any, hide_unknown: bool = False) -> Any:
    """A parsed spec (dataclasses) → the camelCase object the API server would store: unset fields left out.
    ``hide_unknown``: a field that preserves unknown fields is ``{}``, which is all a CEL rule sees of it."""
    if dataclasses.is_dataclass(value):
        cls: type = type(value)
        hints = _type_hints(cls)
        return {
            camel(f.name): {}
            if hide_unknown and _preserves_unknown(unwrap_optional(hints[f.name]))
            else to_object(getattr(value, f.name), hide_unknown)
            for f in _fields(cls)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, list):
        return [to_object(v, hide_unknown) for v in value]
    if isinstance(value, dict):
        return {k: to_object(v, hide_unknown) for k, v in value.items()}
    return value


def _preserves_unknown(annotation: Any) -> bool:
    return annotation in (Any, dict) or typing.get_args(annotation)[1:] == (Any,)


# --------------------------------------------------------------------------- parsing


def parse(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    """``data`` (camelCase mapping) → an instance of ``cls``; appends every problem to ``problems``
    as ``"<path>.<field>: expected …, got …"`` and uses the default for a field that is wrong."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{path}: expected an object, got {bounded_repr(data)}")
        data = {}
    hints = _type_hints(cls)
    fields = {camel(f.name): f for f in _fields(cls)}
    for key in data:
        if key not in fields:
            problems.append(f"{path}.{key}: unknown field (known: {', '.join(fields)})")
    values = {}
    for key, f in fields.items():
        where = f"{path}.{key}"
        if key not in data or data[key] is None:
            if f.metadata.get(REQUIRED):
                problems.append(f"{where}: required ({f.metadata['doc']})")
            continue
        annotation = unwrap_optional(hints[f.name])
        value = _parse_value(annotation, data[key], where, problems)
        if value is _INVALID:
            continue
        if _constraint_problem(f.metadata, value, where, problems):
            continue
        values[f.name] = value
    return cls(**values)


_INVALID = object()


def _parse_value(annotation: Any, value: Any, where: str, problems: list[str]) -> Any:
    if _is_dataclass_type(annotation):
        return parse(annotation, value, where, problems)
    origin = typing.get_origin(annotation)
    expected = None
    if annotation is str and not isinstance(value, str):
        expected = "a string"
    elif annotation is bool and not isinstance(value, bool):
        expected = "true or false"
    elif annotation is int and (isinstance(value, bool) or not isinstance(value, int)):
        expected = "a whole number"
    elif annotation is int and not INT64[0] <= value <= INT64[1]:
        expected = "a whole number of 64 bits (as Kubernetes stores it)"
    elif annotation is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        expected = "a number"
    elif origin is list:
        if not isinstance(value, list):
            expected = "a list"
        else:
            (item,) = typing.get_args(annotation)
            parsed = [_parse_value(item, v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
            return _INVALID if any(p is _INVALID for p in parsed) else parsed
    elif (origin is dict or annotation in (dict, Any)) and not isinstance(value, dict):
        expected = "an object"
    elif origin is dict:
        _, item = typing.get_args(annotation)
        if item is not Any:
            entries = {k: _parse_value(item, v, f"{where}.{k}", problems) for k, v in value.items()}
            return _INVALID if any(p is _INVALID for p in entries.values()) else entries
    if expected:
        problems.append(f"{where}: expected {expected}, got {bounded_repr(value)}")
        return _INVALID
    return float(value) if annotation is float else value


def _constraint_problem(meta: Mapping[str, Any], value: Any, where: str, problems: list[str]) -> bool:
    enum, minimum, maximum, pattern = meta.get("enum"), meta.get("minimum"), meta.get("maximum"), meta.get("pattern")
    problem = None
    if enum is not None and value not in enum:
        problem = f"expected one of {', '.join(map(str, enum))}, got {bounded_repr(value)}"
    elif minimum is not None and isinstance(value, (int, float)):
        if meta.get("exclusive_minimum") and value <= minimum:
            problem = f"expected a number > {minimum}, got {bounded_repr(value)}"
        elif value < minimum:
            problem = f"expected a number >= {minimum}, got {bounded_repr(value)}"
    if problem is None and maximum is not None and isinstance(value, (int, float)):
        if meta.get("exclusive_maximum") and value >= maximum:
            problem = f"expected a number < {maximum}, got {bounded_repr(value)}"
        elif value > maximum:
            problem = f"expected a number <= {maximum}, got {bounded_repr(value)}"
    if problem is None and pattern is not None and isinstance(value, str) and not re.fullmatch(pattern, value):
        problem = f"expected {meta.get('pattern_doc') or 'a value matching ' + pattern}, got {bounded_repr(value)}"
    if problem is None:
        problem = _size_problem(meta, value)
    if problem:
        problems.append(f"{where}: {problem}")
    return problem is not None


def _size_problem(meta: Mapping[str, Any], value: Any) -> str | None:
    """A value longer than its field's bound (maxLength, maxItems, items' maxLength, maxProperties)."""
    bounds = (
        ("max_length", str, "characters"),
        ("max_items", list, "items"),
        ("max_properties", dict, "entries"),
    )
    for key, kind, unit in bounds:
        limit = meta.get(key)
        if limit is not None and isinstance(value, kind) and len(value) > limit:
            return f"expected at most {limit} {unit}, got {len(value)}"
    limit = meta.get("item_max_length")
    if limit is not None and isinstance(value, list):
        for item in value:
            if isinstance(item, str) and len(item) > limit:
                return f"expected items of at most {limit} characters, got one of {len(item)}"
    return None
