"""Kubernetes resource quantities (``500m``, ``2Gi``, ``1e3``) as numbers: GPU limits, downward-API resource
fields, an emptyDir's ``sizeLimit``."""

from __future__ import annotations

import re
from typing import Any

_SUFFIX = {
    "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip  # a table: decimal suffixes on one row, binary on the next


def quantity(text: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2Gi``, ``1e3``) as a number."""
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]
