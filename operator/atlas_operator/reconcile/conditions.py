"""A status condition of a declared type, as every step of a reconciliation writes it."""

from __future__ import annotations

from typing import Any

from atlas_operator.run_status import ConditionType as Condition


def condition(type_: Condition, ok: bool, reason: str, message: str) -> dict[str, Any]:
    """A condition of a declared type (ConditionType: a type not in the CRD's enum raises here, not at the API).
    ``reason``: an EventReason where an Event says the same, else the condition's own word; kept as plain text."""
    return {
        "type": str(Condition(type_)),
        "status": "True" if ok else "False",
        "reason": str(reason),
        "message": message,
    }
