"""The layout is ruff's (`ruff format --check .` in make test) except where a table reads better by hand: there the
`# fmt: skip` says why on the same line, `# fmt: skip  # <reason>` (docs/development.md)."""

from __future__ import annotations

import io
import re
import tokenize

from harness.env import REPO

#: The folders of the project's Python (ruff formats them all).
PYTHON_FOLDERS = (
    "atlas_cli",
    "atlas_cluster",
    "atlas_contract",
    "atlas_core",
    "bench",
    "harness",
    "operator",
    "reward_system",
    "tests",
    "tools",
)
#: A formatter pragma (``skip``, ``off``), then optionally ``  # <reason>``.
PRAGMA = re.compile(r"#\s*fmt:\s*(skip|off)\b(?P<rest>.*)")
REASON = re.compile(r"\s+#\s*\S")


def bare_pragmas(source: str) -> list[int]:
    """The lines of ``source`` whose ``# fmt: skip`` or ``# fmt: off`` comment gives no reason after it."""
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        found = PRAGMA.search(token.string) if token.type == tokenize.COMMENT else None
        if found and not REASON.match(found["rest"]):
            lines.append(token.start[0])
    return lines


def test_a_pragma_without_its_reason_is_found_and_one_in_a_string_is_not():
    source = 'a = [1,  2]  # fmt: skip\nb = [1,  2]  # fmt: skip  # a table: one row per line\nc = "# fmt: skip"\n'
    assert bare_pragmas(source) == [1]


def test_every_fmt_skip_says_why():
    bare = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in PYTHON_FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
        for line in bare_pragmas(path.read_text())
    ]
    assert bare == [], "a `# fmt: skip` gives its reason on the same line: `# fmt: skip  # <reason>`"
