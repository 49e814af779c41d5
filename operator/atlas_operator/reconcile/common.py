"""What every part of a reconciliation shares: its errors, a condition of a declared type, the log."""

from __future__ import annotations

import logging
from typing import Any

from atlas_operator.ownership import Foreign
from atlas_operator.run_status import ConditionType as Condition

log = logging.getLogger("atlas_operator")


class RetryLater(Exception):
    """A transient condition (API error, an old job still terminating): retry the reconciliation."""


class NameConflict(Exception):
    """An object this run does not control was found under one of its child names when creating it."""

    def __init__(self, foreign: Foreign):
        super().__init__(str(foreign))
        self.foreign = foreign


def condition(type_: Condition, ok: bool, reason: str, message: str) -> dict[str, Any]:
    """A condition of a declared type (ConditionType: a type not in the CRD's enum raises here, not at the API).
    ``reason``: an EventReason where an Event says the same, else the condition's own word; kept as plain text."""
    return {
        "type": str(Condition(type_)),
        "status": "True" if ok else "False",
        "reason": str(reason),
        "message": message,
    }
