"""The bench scripts run outside ``make test`` (they take minutes to hours), so a refactor could break them
unseen: every name they import must exist, and each must answer ``--help``."""

from __future__ import annotations

import ast
import importlib
import re
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(path for path in BENCH.glob("*.py") if path.name != "__init__.py")


def imported_names(script: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of each absolute ``from module import name`` in the script, lazy ones included."""
    tree = ast.parse(script.read_text(), filename=str(script))
    return [
        (node.lineno, node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module != "__future__"
        for alias in node.names
    ]


def test_the_scripts_make_bench_runs_are_the_ones_checked():
    """The scripts below are found by a glob: an empty or wrong glob would make the parametrized tests check
    nothing. Every script the Makefile's bench target runs (bench/x.py or -m bench.x) is among them."""
    makefile = (BENCH.parent / "Makefile").read_text()
    target = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    run = set(re.findall(r"bench[/.](\w+)", target))
    assert run, "the Makefile's bench target runs no bench script"
    assert run <= {script.stem for script in SCRIPTS}, f"make bench runs scripts not found: {run}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_name_a_bench_script_imports_exists(script):
    missing = []
    for line, module, name in imported_names(script):
        found = importlib.import_module(module)
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: {module}.{name}")
    assert not missing, "bench imports names that no longer exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_bench_script_answers_help(script, monkeypatch, capsys):
    """``python -m bench.<script> --help`` from the repository root, as the Makefile runs them, in this process
    (runpy, as ``-m`` does): a process each cost a Python start and, for most, the training library's imports."""
    monkeypatch.chdir(BENCH.parent)
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(f"bench.{script.stem}", run_name="__main__", alter_sys=True)
    captured = capsys.readouterr()
    assert done.value.code == 0 and "usage:" in captured.out, captured.err[-2000:]
