"""What a reconciliation raises to say it cannot go on now: retry later, or a child's name is taken."""

from __future__ import annotations

from atlas_operator.ownership import Foreign


class RetryLater(Exception):
    """A transient condition (API error, an old job still terminating): retry the reconciliation."""


class NameConflict(Exception):
    """An object this run does not control was found under one of its child names when creating it."""

    def __init__(self, foreign: Foreign):
        super().__init__(str(foreign))
        self.foreign = foreign
