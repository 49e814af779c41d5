"""``atlas eval``: does the student do better with the teacher than without?

The two-pass evaluation (:func:`atlas_core.evaluation.evaluate_teaching`) from the command line: the
student answers held-out problems alone and with the teacher's guidance, ``--samples`` times each; a
progress bar while it runs, a table of every figure (overall and by diagnosed capability) at the end,
``eval.json`` and ``problems.jsonl`` in ``--output``.

Exit status: 0 done; 2 bad input (one ``error: --option: …`` line per problem, all found before any model
is loaded: numbers out of range, a missing or unreadable model folder, an endpoint that does not answer
``GET /v1/models``, a dataset that cannot be loaded or scored, unknown reward functions, a weight count
that does not match, a ``problems.jsonl`` of another evaluation in ``--output``; and a model that exists but
does not load); 1 a model failed mid-way: the finished problems are kept in ``problems.jsonl`` and running
the same command again resumes from them.

Its parts: eval_options.py (the options), eval_plan.py (the checks, before any model loads) and eval_run.py
(the run)."""

from __future__ import annotations

import argparse
import os
import sys

from atlas_core.cli.eval_options import add_arguments, build_parser
from atlas_core.cli.eval_plan import check, whole_test_mix
from atlas_core.cli.eval_run import run

__all__ = ["add_arguments", "main", "run_args", "whole_test_mix"]


def run_args(args: argparse.Namespace) -> int:
    """``atlas eval`` with parsed options."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    plan, problems, notes = check(args)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    assert plan is not None  # check() gives a plan when it finds no problem
    return run(plan, notes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_args(args)


if __name__ == "__main__":
    sys.exit(main())
