"""The one error type for input that cannot run: a spec, a run configuration, CLI arguments."""

from __future__ import annotations


class InvalidFields(Exception):
    """Every reason something cannot run, one line each, as ``"<field>: expected …, got …"``.

    Raised, under this one name, by the operator's manifest parser and by the trainer's run configuration
    loader, so a caller catches one type and prints ``problems`` one per line (the CLI exits 2; the operator
    sets phase ``Invalid``)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
