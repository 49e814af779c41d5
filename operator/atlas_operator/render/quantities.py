"""Kubernetes quantities as numbers, and the QoS class a pod spec gets from its containers' requests and limits."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

_QUANTITY_SUFFIX: dict[str, int | Decimal] = {
    "": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip  # a table: fractions, decimal, binary suffixes a row each


_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity (``32``, ``500m``, ``16Gi``, ``1.5e3``: the spec's QUANTITY_PATTERN) as a number."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * Decimal(10) ** int(suffix[1:])
    return number * _QUANTITY_SUFFIX[suffix]


def byte_quantity(amount: Decimal) -> str:
    """Bytes as the shortest exact quantity: ``66Gi``, ``1536Mi``, else whole bytes."""
    whole = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if whole and whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)


def qos_class(pod_spec: dict[str, Any]) -> str:
    """The QoS class Kubernetes gives a pod of this spec (its ``status.qosClass``: ``ComputePodQOS``, over the
    containers and init containers, CPU and memory only, a zero counting as unset): BestEffort when none requests or
    limits either, Guaranteed when every one limits both and the totals of the requests equal the limits', else
    Burstable."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        resources = container.get("resources") or {}
        # The API server defaults a request that is not set to its limit.
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for totals, amounts in ((requests, asked), (limits, resources.get("limits") or {})):
            for name in ("cpu", "memory"):
                amount = quantity(str(amounts[name])) if name in amounts else Decimal(0)
                if amount > 0:
                    totals[name] = totals.get(name, Decimal(0)) + amount
                elif totals is limits:
                    guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"
