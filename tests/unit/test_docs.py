"""The docs against the code: the generated reference is current, and every name the docs cite exists.

README.md and every page under docs/ are parsed: the paths, links, module names, commands and their options, metric
names, chart values, CRD fields, make targets and ATLAS_* variables they give must exist in the repository or be
accepted / exported by the code. The docs' wording is free: nothing here matches a sentence. Fast: no training, no
subprocess, nothing imports torch.
"""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")))
#: Written by hand: the pages the cited-name checks must find something in (the generated ones are the code's words).
MANUAL = tuple(name for name in DOC_FILES if not name.startswith("docs/reference/"))
#: Where a path in the docs may be relative to: the root, operator/ (atlas_operator/…), the chart (files/…).
BASES = (REPO, REPO / "operator", REPO / "charts" / "atlas-operator")
FILE_TOKEN = re.compile(
    r"(?<![\w/.-])((?:[\w*-]+/)*[\w*-]+\.(?:py|yaml|yml|json|txt|sh|md|toml)|(?:[\w-]+/)*Dockerfile)(?![\w/])"
)
DOTTED = re.compile(r"\b(atlas_(?:cli|cluster|core|operator|contract)(?:\.\w+)+)")
BACKTICK = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
OPTION = re.compile(r"(?:^|(?<=[\s\[/(]))(--?[A-Za-z][\w-]*)")
METRIC = re.compile(r"\b(atlas_\w+)(\*|\{[\w,]*\})?(?!\w|\.(?:json|jsonl|yaml|py)\b)")  # not a file (atlas_run.json)
MODULE_NAMES = {"atlas_cli", "atlas_cluster", "atlas_core", "atlas_operator", "atlas_contract"}
OTHER_PROGRAMS = {"python", "python3", "accelerate", "kopf", "kubectl", "helm", "make", "trl", "vllm", "docker", "pip"}


def doc(name: str) -> str:
    return (REPO / name).read_text()


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no '## {title}' section"
    return match.group(1)


def chunks(text: str) -> list[str]:
    """Paragraphs, with each table row and each code-block line on its own (a command's options stay in it)."""
    out, paragraph, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("\n".join(paragraph))
            paragraph = []
        elif fenced or line.startswith("|"):
            out.append("\n".join(paragraph))
            paragraph = []
            out.append(line.split(" #")[0] if fenced else line)
        elif not line.strip() or re.match(r"\s*([-*]|\d+\.) ", line):  # a blank line or a new list item
            out.append("\n".join(paragraph))
            paragraph = [line] if line.strip() else []
        else:
            paragraph.append(line)
    out.append("\n".join(paragraph))
    return [c for c in out if c.strip()]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def links(name: str) -> list[str]:
    """The targets of the Markdown links of ``name`` (code is not Markdown: a regex's ``](`` is no link)."""
    return LINK.findall(BACKTICK.sub("", prose(doc(name))))


def code_lines(name: str) -> list[str]:
    """The lines of ``name``'s fenced code blocks."""
    return [
        line
        for block in re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", doc(name), re.S | re.M)
        for line in block.splitlines()
    ]


def spans(name: str) -> list[str]:
    return [" ".join(s.split()) for chunk in chunks(doc(name)) for s in BACKTICK.findall(chunk)]


def exists(relative: str, bases=BASES) -> bool:
    relative = relative.rstrip("/")
    for base in bases:
        if "*" in relative:
            if any(base.glob(relative)):
                return True
        elif (base / relative).exists():
            return True
    return False


@cache
def top_level_names(path: Path) -> frozenset[str]:
    """Names a module defines or imports at its top level (read with ast: nothing is imported)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return frozenset(names)


def module_file(parts: list[str]) -> Path | None:
    for base in (REPO, REPO / "operator"):
        path = base.joinpath(*parts)
        if path.with_suffix(".py").is_file():
            return path.with_suffix(".py")
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
    return None


def resolves(dotted: str) -> bool:
    """``a.b.c`` is a module, or a module plus a name that module defines."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(parts[:i])
        if path is not None:
            return i == len(parts) or parts[i] in top_level_names(path)
    return False


# --------------------------------------------------------------------------- the generated reference and the pages


def test_the_generated_reference_is_current():
    from tools.reference import stale_pages

    stale = stale_pages()
    assert not stale, f"stale generated pages (run `make reference`): {stale}"


def test_the_package_map_walks_the_packages_and_names_a_module_without_a_docstring(tmp_path):
    from tools.package_map import END, START, MissingDocstring, first_sentence, package_map, with_package_map

    def module(relative: str, source: str) -> None:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(source)

    module("pkg/__init__.py", '"""The package, e.g. this one. More after the first sentence."""\n')
    module("pkg/sub/__init__.py", '"""A subpackage: see :mod:`pkg.sub.leaf`."""\n')
    module("pkg/sub/leaf.py", '"""A module moved here\nover two lines.\n\nIts details."""\n')
    module("pkg/sub/data/file.txt", "a folder without __init__.py is no package\n")
    assert package_map(tmp_path, ("pkg",)) == (
        "- `pkg` (pkg/): The package, e.g. this one.\n"
        "  - `pkg.sub`: A subpackage: see `pkg.sub.leaf`.\n"
        "    - `pkg.sub.leaf`: A module moved here over two lines."
    )
    page = f"# Page\n\n{START}\nold map\n{END}\n\nAfter.\n"
    assert "old map" not in with_package_map(page, tmp_path, ("pkg",))
    assert with_package_map(page, tmp_path, ("pkg",)).endswith(
        f"pkg.sub.leaf`: A module moved here over two lines.\n{END}\n\nAfter.\n"
    )
    module("pkg/sub/bare.py", "VALUE = 1\n")
    with pytest.raises(MissingDocstring, match="pkg/sub/bare.py"):
        package_map(tmp_path, ("pkg",))
    assert first_sentence("Ends here. Not this.") == "Ends here."


def test_the_readme_is_short_and_links_every_page():
    readme = doc("README.md")
    assert len(readme.splitlines()) <= 200, "README.md: at most 200 lines; the manual is docs/"
    linked = {target.split("#")[0] for target in links("README.md")}
    missing = [name for name in DOC_FILES[1:] if name not in linked]
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("name", MANUAL[1:])
def test_each_page_stands_alone(name):
    """A title, an introduction before the first section, and no pointer into another page's context."""
    text = doc(name)
    assert text.startswith("# "), f"{name}: no title"
    intro = text.split("\n## ", 1)[0].split("\n", 1)[1]
    assert len(" ".join(prose(intro).split())) > 80, f"{name}: no introduction before its first section"
    for phrase in ("see above", "the README", "../shared"):
        assert phrase.lower() not in text.lower(), f"{name} says {phrase!r}"


def github_anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for title in re.findall(r"^#+ (.*)$", prose(path.read_text()), re.M):
        anchor = github_anchor(title)
        out.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return frozenset(out)


@pytest.mark.parametrize("name", DOC_FILES)
def test_relative_links_resolve(name):
    problems = []
    for target in links(name):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (REPO / name).parent / path if path else REPO / name
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.resolve()):
            problems.append(f"{target}: no such section")
    assert not problems, f"{name}: {problems}"


# --------------------------------------------------------------------------- paths and module names


def layout_references() -> list[tuple[str, str]]:
    """(entry, referenced path) for every line of docs/development.md's Layout tree: the entry itself and every
    file named in its description."""
    block = re.search(r"```\n(.*?)```", section(doc("docs/development.md"), "Layout"), re.S).group(1)
    refs, top, entry = [], None, None
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent < 8:  # a new entry: `dir/` or `file` at column 0, a child of the last one at column 2
            head, _, description = line.strip().partition(" ")
            entry = head if indent == 0 else f"{top}/{head}"
            if indent == 0:
                top = head.rstrip("/")
            refs.append((entry, entry))
        else:  # a continuation of the entry's description
            description = line
        folder = entry.rstrip("/") if entry.endswith("/") else entry.rpartition("/")[0]
        for token in FILE_TOKEN.findall(description):
            refs.append((entry, f"{folder}/{token}|{top}/{token}|{token}"))
    return refs


def test_layout_entries_and_the_files_they_name_exist():
    refs = layout_references()
    assert len(refs) > 40, "the Layout tree was not parsed"
    missing = [f"{entry}: {ref.split('|')[-1]}" for entry, ref in refs if not any(exists(r) for r in ref.split("|"))]
    assert not missing, f"docs/development.md Layout names paths that do not exist: {missing}"
    named = {entry.rstrip("/") for entry, _ in refs}
    for package in ("atlas_cli", "atlas_cluster", "atlas_contract", "atlas_core", "operator/atlas_operator"):
        assert package in named, f"the Layout does not list {package}/"


@pytest.mark.parametrize("name", DOC_FILES)
def test_backticked_paths_exist(name):
    known = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    known |= {"atlas_operator", "files", "dashboards", "templates"}
    known -= {"outputs"}
    missing = []
    for span in spans(name):
        if "/" not in span or not re.fullmatch(r"[\w.-]+(/[\w.*-]+)*/?", span) or span.split("/")[0] not in known:
            continue
        if not exists(span):
            missing.append(span)
    assert not missing, f"{name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("name", DOC_FILES)
def test_dotted_module_names_resolve(name):
    text = doc(name)
    names = set(DOTTED.findall(text))
    # `from atlas_core.x import A, B` in the examples: A and B must be defined there.
    for module, imported in re.findall(r"from (atlas_\w+(?:\.\w+)*) import ([\w, ]+)", text):
        names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
    unresolved = sorted(n for n in names if not resolves(n))
    assert not unresolved, f"{name} names modules or attributes that do not exist: {unresolved}"


def test_the_docs_name_modules_and_paths():
    """The checks above are not vacuous: the manual names many modules and paths."""
    text = "\n".join(doc(n) for n in MANUAL)
    assert len(set(DOTTED.findall(text))) > 30
    assert len({s for n in MANUAL for s in spans(n) if "/" in s}) > 100


def test_recipes_named_in_the_docs_exist():
    recipes = {p.stem for p in (REPO / "atlas_core" / "configs" / "recipe").glob("*.yaml")}
    named = set()
    for name in MANUAL:
        text = doc(name)
        named |= set(re.findall(r"recipe(?:@_global_)?=(\w+)(?![\w/.])", text))
        for paragraph in chunks(text):
            if "Recipes:" in paragraph:
                after = paragraph.split("Recipes:", 1)[1]
                named |= {s for s in BACKTICK.findall(after) if re.fullmatch(r"[a-z][a-z0-9_]*", s)}
    assert {"tiny_grpo", "teacher_rcl"} <= named
    assert named <= recipes, f"recipes named in the docs but not in atlas_core/configs/recipe/: {named - recipes}"


def test_examples_named_in_the_docs_exist():
    named = {m for n in DOC_FILES for m in re.findall(r"\bexamples/[\w.-]+\.yaml", doc(n))}
    assert len(named) >= 4
    assert all((REPO / m).is_file() for m in named), sorted(m for m in named if not (REPO / m).is_file())


# --------------------------------------------------------------------------- command line


def documented_commands() -> dict[str, dict[str, list[str]]]:
    """command → {"options": [...], "spans": [...]} for every backticked `atlas <command> …` (and code line)
    of the docs, with the options in it and in the backticked spans after it in the same paragraph/row."""
    commands: dict[str, dict[str, list[str]]] = {}
    # "heads": what follows the command's name in the span that names it (`atlas cluster up …` → `up …`).
    for name in DOC_FILES:
        for chunk in chunks(doc(name)):
            found = BACKTICK.findall(chunk) if "`" in chunk else [chunk.strip()]
            current = None
            for span in found:
                span = " ".join(span.split()).replace("\\|", "|")  # a table's escaped pipe
                span = re.sub(r"^eval \"\$\((.*)\)\"$", r"\1", span)  # eval "$(atlas cluster up)"
                # `atlas watchdog:` (the watchdog's mark) is no command: a command name is not followed by ":".
                match = re.match(r"(?:atlas ([a-z][\w-]*)\b(?!:)|python -m (atlas_core\.cli\.train))\b(.*)", span, re.S)
                if match:
                    current = match.group(1) or match.group(2)
                    span = match.group(3)
                    commands.setdefault(current, {"options": [], "spans": [], "heads": []})
                    commands[current]["heads"].append(span.strip())
                elif span.split(" ")[0] in OTHER_PROGRAMS:  # another program's command line: not ours
                    current = None
                if current is not None:
                    commands[current]["spans"].append(span)
                    commands[current]["options"] += OPTION.findall(span)
    return commands


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from atlas_cli.main import build_parser

    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _help_text(function: str, capsys) -> str:
    """`atlas render --help` / `atlas operator --help`: their parsers are built inside these functions."""
    import atlas_operator.cli

    with pytest.raises(SystemExit) as exit_:
        getattr(atlas_operator.cli, function)(["--help"])
    assert exit_.value.code in (0, None)
    return capsys.readouterr().out


def _options_in_help(text: str) -> set[str]:
    return set(re.findall(r"(?:^|[\s,\[])(--?[A-Za-z][\w-]*)", text))


def _choices_in_help(text: str) -> dict[str, set[str]]:
    return {opt: set(values.split(",")) for opt, values in re.findall(r"(--[\w-]+) \{([\w,-]+)\}", text)}


def _kopf_run_options() -> set[str]:
    from kopf.cli import main as kopf_main

    run = kopf_main.commands["run"]
    return {opt for param in run.params for opt in (*param.opts, *param.secondary_opts) if opt.startswith("-")}


def _documented_choices(spans: list[str]) -> dict[str, set[str]]:
    return {opt: set(values.split("|")) for s in spans for opt, values in re.findall(r"(--[\w-]+) (\w+(?:\|\w+)+)", s)}


def test_every_documented_atlas_command_exists():
    commands = documented_commands()
    subcommands = _subparsers()
    documented = {c for c in commands if c != "atlas_core.cli.train"}
    assert {"demo", "train", "eval", "render", "operator", "cluster"} <= documented, documented
    unknown = documented - set(subcommands)
    assert not unknown, f"the docs name `atlas` commands the CLI does not have: {sorted(unknown)}"


def test_demo_train_and_eval_options_are_accepted_with_the_documented_defaults():
    commands = documented_commands()
    subcommands = _subparsers()
    checked = 0
    for command in ("demo", "train", "eval"):
        parser = subcommands[command]
        actions = {opt: a for a in parser._actions for opt in a.option_strings}
        for option in commands[command]["options"]:
            assert option in actions, f"the docs: `atlas {command} {option}` is not an option of the parser"
            checked += 1
        # `[--steps 300]`: the default the code applies (placeholders such as NS or <port> are not checked).
        for span in commands[command]["spans"]:
            for option, value in re.findall(r"\[(--[\w-]+) ([^\]\s]+)\]", span):
                if value.isupper() or "<" in value:
                    continue
                assert str(actions[option].default) == value, (
                    f"the docs: `atlas {command} [{option} {value}]` but the default is {actions[option].default!r}"
                )
        for option, values in _documented_choices(commands[command]["spans"]).items():
            assert set(actions[option].choices or ()) == values, f"the docs: {option} {values}"
    assert checked >= 10


def test_render_options_are_accepted(capsys):
    options = documented_commands()["render"]["options"]
    assert "-n" in options
    text = _help_text("render_main", capsys)
    unknown = sorted(set(options) - _options_in_help(text))
    assert not unknown, f"the docs list `atlas render` options it does not take: {unknown}"


def test_operator_options_are_accepted(capsys):
    """Each option is one of `atlas operator`'s own or one of `kopf run`'s (which it passes through)."""
    command = documented_commands()["operator"]
    text = _help_text("operator_main", capsys)
    own, kopf = _options_in_help(text), _kopf_run_options()
    assert {"--namespace", "--log-format"} <= set(command["options"])
    unknown = sorted(set(command["options"]) - own - kopf)
    assert not unknown, f"the docs list `atlas operator` options that neither it nor `kopf run` takes: {unknown}"
    actual = _choices_in_help(text)
    for option, values in _documented_choices(command["spans"]).items():
        assert actual.get(option) == values, (
            f"the docs: `{option}` takes {sorted(values)}, the code {actual.get(option)}"
        )


def test_cluster_options_are_accepted():
    """`atlas cluster up|down|status` options: those of atlas_cluster/cli.py's parser (each action's own)."""
    from atlas_cluster.cli import parser

    command = documented_commands()["cluster"]
    (actions,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    accepted = {opt for sub in actions.choices.values() for a in sub._actions for opt in a.option_strings}
    assert {"--bin-dir", "--name", "--nodes"} <= set(command["options"])
    unknown = sorted(set(command["options"]) - accepted)
    assert not unknown, f"the docs list `atlas cluster` options it does not take: {unknown}"
    named = {word for head in command["heads"] if head.split() for word in head.split()[0].split("|")}
    assert {"up", "down", "status"} <= named, named
    assert named <= set(actions.choices), f"the docs name `atlas cluster` actions it does not have: {named}"


def test_train_entrypoint_options_are_accepted():
    from atlas_core.cli.train import USAGE

    options = documented_commands()["atlas_core.cli.train"]["options"]
    assert "--print-config" in options
    unknown = sorted(set(options) - _options_in_help(USAGE) - {"-h", "--help"})
    assert not unknown, f"the docs list `python -m atlas_core.cli.train` options it does not take: {unknown}"


def test_make_targets_named_in_the_docs_exist():
    targets = set(re.findall(r"^([\w-]+):", doc("Makefile"), re.M))
    named = {
        match.group(1)
        for n in DOC_FILES
        for line in (*spans(n), *code_lines(n))
        if (match := re.match(r"\s*make ([a-z][\w-]*)", line))
    }
    assert {"demo", "test", "reference", "cluster-demo"} <= named
    assert named <= targets, f"the docs name make targets the Makefile does not have: {sorted(named - targets)}"


# --------------------------------------------------------------------------- the cluster: CRD fields, chart values


@cache
def _crd_schemas() -> tuple[dict, ...]:
    from atlas_operator.crd import custom_resource_definition
    from atlas_operator.spec import KINDS

    return tuple(custom_resource_definition(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for kind in KINDS)


def _field_exists(path: str) -> bool:
    """``spec.rollout.mode`` (or ``.status.result``, ``spec.env[*].name``) is a field of either kind; a field that
    takes any fields (``spec.training.extra``) takes any path below it."""
    steps = [s for s in path.strip(".").replace("[*]", "").split(".") if s]
    for root in _crd_schemas():
        schema = root
        for step in steps:
            if schema.get("x-kubernetes-preserve-unknown-fields"):
                return True
            schema = schema.get("items", schema)
            schema = schema.get("properties", {}).get(step)
            if schema is None:
                break
        else:
            return True
    return False


def test_crd_fields_named_in_the_docs_exist():
    from tools.package_map import END, START

    named = set()
    for name in DOC_FILES:
        # The package map quotes the modules' docstrings, which name other objects' fields (a Node's spec.podCIDR).
        text = re.sub(f"{START}.*?{END}", "", doc(name), flags=re.S)
        for span in (" ".join(s.split()) for chunk in chunks(text) for s in BACKTICK.findall(chunk)):
            match = re.match(r"\.?((?:spec|status)(?:\.\w+|\[\*\])+)", span)
            if match and "<" not in span:
                named.add(match.group(1))
    assert len(named) > 60
    missing = sorted(f for f in named if not _field_exists(f))
    assert not missing, f"the docs name CRD fields that do not exist: {missing}"


def _chart_values() -> dict:
    import yaml

    return yaml.safe_load((REPO / "charts/atlas-operator/values.yaml").read_text())


def test_chart_values_named_in_the_docs_exist():
    values = _chart_values()
    named = set()
    for name in DOC_FILES:
        text = doc(name)
        named |= set(re.findall(r"--set ([a-z][\w.]+)=", text))
        for span in spans(name):
            key = re.match(r"([a-z]\w*(?:\.[a-zA-Z]\w*)+)(?::|$| |=)", span)
            if key and key.group(1).split(".")[0] in values and not re.search(r"\.(yaml|json)$", key.group(1)):
                named.add(key.group(1))
    assert len(named) > 15
    missing = []
    for key in sorted(named):
        node = values
        for step in key.split("."):
            if not isinstance(node, dict) or step not in node:
                missing.append(key)
                break
            node = node[step]
    assert not missing, f"the docs name chart values that do not exist: {missing}"


def test_atlas_variables_named_in_the_docs_exist():
    """Each ATLAS_* variable the docs name is read or set somewhere in the code or the chart."""
    named = {v for n in DOC_FILES for v in re.findall(r"\bATLAS_[A-Z0-9_]*[A-Z0-9]\b", doc(n))}
    sources = [*REPO.glob("atlas_*/**/*.py"), *REPO.glob("operator/**/*.py"), *REPO.glob("charts/**/*.yaml")]
    sources += [*REPO.glob("charts/**/*.tpl"), REPO / "Makefile", *REPO.glob("tests/**/*.py"), REPO / ".ci" / "run"]
    code = "\n".join(p.read_text() for p in sources if p.is_file())
    assert len(named) > 10
    missing = sorted(v for v in named if v not in code)
    assert not missing, f"the docs name variables nothing reads or sets: {missing}"


def test_the_jobset_install_command_is_the_operators():
    from atlas_operator.reconcile import JOB_CRDS

    command = r"kubectl apply --server-side -f \S*jobset\S*manifests\.yaml"
    installs = {m for n in DOC_FILES for m in re.findall(command, doc(n))}
    assert installs, "the docs: how to install JobSet"
    for install in installs:
        assert install in JOB_CRDS["JobSet"][2], f"{install} is not what the operator tells users"


# --------------------------------------------------------------------------- metrics and ports


def _operator_names() -> tuple[set[str], dict[str, tuple[str, ...]]]:
    """Series names of the operator registry (a labelled family has no samples until used, so the names
    come from the families too) and each family's label names."""
    from atlas_operator import metrics

    names = set(metrics.exported_metric_names())
    suffixes = {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum"), "gauge": ("",)}
    for family in metrics.REGISTRY.collect():
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names, _labels(metrics.REGISTRY)


def _labels(registry) -> dict[str, tuple[str, ...]]:
    labels = {}
    for collector, series in registry._collector_to_names.items():
        for name in series:
            labels[name] = tuple(getattr(collector, "_labelnames", ()))
    return labels


def test_every_metric_named_in_the_docs_is_exported():
    from atlas_core.telemetry import metrics as trainer_metrics

    trainer = set(trainer_metrics.exported_metric_names())
    operator, operator_labels = _operator_names()
    from atlas_contract.tracking import EVALUATION_METRICS

    # A tracking run's evaluation metrics (docs/tracking.md) are declared in atlas_contract/tracking.py, four of them
    # Prometheus metrics too.
    exported = trainer | operator | set(EVALUATION_METRICS.values())
    labels = {**_labels(trainer_metrics.TRAINER_REGISTRY), **operator_labels}
    assert any(n.endswith("_total") for n in trainer), "counters are exported with their _total suffix"
    checked, problems = 0, []
    for name in DOC_FILES:
        for metric, suffix in METRIC.findall(doc(name)):
            if metric in MODULE_NAMES:
                continue
            checked += 1
            if suffix == "*":
                if not any(e.startswith(metric) for e in exported):
                    problems.append(f"{name}: {metric}* matches no exported metric")
                continue
            if metric not in exported:
                problems.append(f"{name}: {metric} is not exported")
                continue
            if suffix.startswith("{"):
                documented = tuple(x for x in suffix.strip("{}").split(",") if x)
                actual = tuple(x for x in labels.get(metric, ()) if x != "le")
                if set(documented) != set(actual):
                    problems.append(f"{name}: {metric}{suffix} but its labels are {actual}")
    assert checked > 30
    assert not problems, "\n".join(problems)


def test_teaching_log_keys_named_in_the_docs_exist():
    """The `teaching/*` keys the docs name are logged by the teacher trainer (its source names each)."""
    sources = "\n".join(p.read_text() for p in (REPO / "atlas_core").rglob("*.py"))
    named = {k for n in DOC_FILES for k in re.findall(r"`(teaching/\w+)`", doc(n))}
    assert len(named) >= 5
    missing = sorted(k for k in named if f'"{k}"' not in sources)
    assert not missing, f"the docs name teaching log keys the code never writes: {missing}"


def test_ports_in_the_docs_are_the_code_ports():
    from atlas_contract import names

    ports = {names.TRAINER_METRICS_PORT, names.OPERATOR_METRICS_PORT, names.VLLM_PORT, names.WEIGHT_SYNC_PORT}
    ports.add(names.TRAINJOB_MASTER_PORT)
    cited = {int(p) for n in DOC_FILES for p in re.findall(r"(?::|port |sync )(\d{4,5})\b", doc(n))}
    assert cited <= ports, f"the docs cite ports the code does not use: {sorted(cited - ports)}"
    assert _subparsers()["demo"].get_default("metrics_port") == names.TRAINER_METRICS_PORT
