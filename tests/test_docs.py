"""The docs against the code: paths, module names, CLI options, metric names and ports they cite.

README.md, docs/architecture.md and docs/trainers.md are parsed; every name they give must exist in
the repository or be accepted / exported by the code. Fast: no training, no subprocess.
"""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = ("README.md", "docs/architecture.md", "docs/trainers.md", "docs/local-cluster.md")
#: Where a path in the docs may be relative to: the root, operator/ (atlas_operator/…), the chart (files/…).
BASES = (REPO, REPO / "operator", REPO / "charts" / "atlas-operator")
FILE_TOKEN = re.compile(
    r"(?<![\w/.-])((?:[\w*-]+/)*[\w*-]+\.(?:py|yaml|yml|json|txt|sh|md|toml)|(?:[\w-]+/)*Dockerfile)(?![\w/])"
)
DOTTED = re.compile(r"\b(atlas_(?:cli|cluster|core|operator|contract)(?:\.\w+)+)")
BACKTICK = re.compile(r"`([^`]+)`")
OPTION = re.compile(r"(?:^|(?<=[\s\[/(]))(--?[A-Za-z][\w-]*)")
METRIC = re.compile(r"\b(atlas_\w+)(\*|\{[\w,]*\})?(?!\w|\.(?:json|jsonl|yaml|py)\b)")  # not a file (atlas_run.json)
MODULE_NAMES = {"atlas_cli", "atlas_cluster", "atlas_core", "atlas_operator", "atlas_contract"}
# The operator's kopf indices (named in the architecture doc), not metrics.
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
        if line.startswith("```"):
            fenced = not fenced
            out.append("\n".join(paragraph))
            paragraph = []
        elif fenced or line.startswith("|"):
            out.append("\n".join(paragraph))
            paragraph = []
            out.append(line.split(" #")[0] if fenced else line)
        elif not line.strip() or re.match(r"\s*[-*] ", line):  # a blank line or a new list item
            out.append("\n".join(paragraph))
            paragraph = [line] if line.strip() else []
        else:
            paragraph.append(line)
    out.append("\n".join(paragraph))
    return [c for c in out if c.strip()]


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


# --------------------------------------------------------------------------- paths and module names


def layout_references() -> list[tuple[str, str]]:
    """(entry, referenced path) for every line of the README's Layout tree: the entry itself and every
    file named in its description."""
    block = re.search(r"```\n(.*?)```", section(doc("README.md"), "Layout"), re.S).group(1)
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
    assert not missing, f"README Layout names paths that do not exist: {missing}"
    named = {entry.rstrip("/") for entry, _ in refs}
    for package in ("atlas_contract", "atlas_core", "operator/atlas_operator"):
        assert package in named, f"README Layout does not list {package}/"


@pytest.mark.parametrize("name", DOC_FILES)
def test_backticked_paths_exist(name):
    known = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    known |= {"atlas_operator", "files", "dashboards", "templates"}
    known -= {"outputs"}
    checked, missing = 0, []
    spans = [s for chunk in chunks(doc(name)) for s in BACKTICK.findall(chunk)]
    for span in spans:
        span = " ".join(span.split())
        if "/" not in span or not re.fullmatch(r"[\w.-]+(/[\w.*-]+)*/?", span) or span.split("/")[0] not in known:
            continue
        checked += 1
        if not exists(span):
            missing.append(span)
    assert checked, f"{name}: no repository path found"
    assert not missing, f"{name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("name", DOC_FILES)
def test_dotted_module_names_resolve(name):
    text = doc(name)
    names = set(DOTTED.findall(text))
    # `from atlas_core.x import A, B` in the examples: A and B must be defined there.
    for module, imported in re.findall(r"from (atlas_\w+(?:\.\w+)*) import ([\w, ]+)", text):
        names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
    assert names, f"{name}: no atlas_* module named"
    unresolved = sorted(n for n in names if not resolves(n))
    assert not unresolved, f"{name} names modules or attributes that do not exist: {unresolved}"


def test_architecture_describes_the_contract_package():
    text = doc("docs/architecture.md")
    assert "`atlas_contract`" in text and "InvalidFields" in text
    assert (REPO / "atlas_contract" / "__init__.py").is_file()
    assert "InvalidFields" in top_level_names(REPO / "atlas_contract" / "errors.py")


def test_recipes_named_in_the_docs_exist():
    recipes = {p.stem for p in (REPO / "atlas_core" / "configs" / "recipe").glob("*.yaml")}
    named = set()
    for name in DOC_FILES:
        text = doc(name)
        named |= set(re.findall(r"recipe(?:@_global_)?=(\w+)(?![\w/.])", text))
        for paragraph in chunks(text):
            if "Recipes:" in paragraph:
                after = paragraph.split("Recipes:", 1)[1]
                named |= {s for s in BACKTICK.findall(after) if re.fullmatch(r"[a-z][a-z0-9_]*", s)}
    assert {"tiny_grpo", "teacher_rcl"} <= named
    assert named <= recipes, f"recipes named in the docs but not in atlas_core/configs/recipe/: {named - recipes}"


# --------------------------------------------------------------------------- command line


def documented_commands() -> dict[str, dict[str, list[str]]]:
    """command → {"options": [...], "spans": [...]} for every backticked `atlas <command> …` (and code line)
    of the docs, with the options in it and in the backticked spans after it in the same paragraph/row."""
    commands: dict[str, dict[str, list[str]]] = {}
    for name in DOC_FILES:
        for chunk in chunks(doc(name)):
            spans = BACKTICK.findall(chunk) if "`" in chunk else [chunk.strip()]
            current = None
            for span in spans:
                span = " ".join(span.split())
                # `atlas watchdog:` (the watchdog's mark) is no command: a command name is not followed by ":".
                match = re.match(r"(?:atlas ([a-z][\w-]*)\b(?!:)|python -m (atlas_core\.cli\.train))\b(.*)", span, re.S)
                if match:
                    current = match.group(1) or match.group(2)
                    span = match.group(3)
                    commands.setdefault(current, {"options": [], "spans": []})
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
    assert {"demo", "train", "render", "operator"} <= documented, documented
    unknown = documented - set(subcommands)
    assert not unknown, f"the docs name `atlas` commands the CLI does not have: {sorted(unknown)}"


def test_demo_and_train_options_are_accepted_with_the_documented_defaults():
    commands = documented_commands()
    subcommands = _subparsers()
    checked = 0
    for command in ("demo", "train", "eval"):
        if command not in commands:
            continue
        parser = subcommands[command]
        actions = {opt: a for a in parser._actions for opt in a.option_strings}
        for option in commands[command]["options"]:
            assert option in actions, f"README: `atlas {command} {option}` is not an option of the parser"
            checked += 1
        # `[--steps 300]`: the default the code applies (placeholders such as NS or <port> are not checked).
        for span in commands[command]["spans"]:
            for option, value in re.findall(r"\[(--[\w-]+) ([^\]\s]+)\]", span):
                if value.isupper() or "<" in value:
                    continue
                assert str(actions[option].default) == value, (
                    f"README: `atlas {command} [{option} {value}]` but the default is {actions[option].default!r}"
                )
        for option, values in _documented_choices(commands[command]["spans"]).items():
            assert set(actions[option].choices or ()) == values, f"README: {option} {values}"
    assert checked >= 5  # --steps --sft-steps --teacher-steps --output --metrics-port


def test_render_options_are_accepted(capsys):
    options = documented_commands()["render"]["options"]
    assert "-n" in options
    text = _help_text("render_main", capsys)
    accepted = _options_in_help(text)
    unknown = sorted(set(options) - accepted)
    assert not unknown, f"README lists `atlas render` options it does not take: {unknown}"


def test_operator_options_are_accepted(capsys):
    """Each option is one of `atlas operator`'s own or one of `kopf run`'s (which it passes through)."""
    command = documented_commands()["operator"]
    text = _help_text("operator_main", capsys)
    own, kopf = _options_in_help(text), _kopf_run_options()
    assert {"--namespace", "--log-format"} <= set(command["options"])
    unknown = sorted(set(command["options"]) - own - kopf)
    assert not unknown, f"README lists `atlas operator` options that neither it nor `kopf run` takes: {unknown}"
    actual = _choices_in_help(text)
    for option, values in _documented_choices(command["spans"]).items():
        assert actual.get(option) == values, f"README: `{option}` takes {sorted(values)}, the code {actual.get(option)}"


def test_cluster_options_are_accepted():
    """`atlas cluster up|down|status` options: those of atlas_cluster/cli.py's parser (each action's own)."""
    from atlas_cluster.cli import parser

    command = documented_commands()["cluster"]
    (actions,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    accepted = {opt for sub in actions.choices.values() for a in sub._actions for opt in a.option_strings}
    assert {"--bin-dir", "--name"} <= set(command["options"])
    unknown = sorted(set(command["options"]) - accepted)
    assert not unknown, f"the docs list `atlas cluster` options it does not take: {unknown}"
    actions_named = {span.split()[0] for span in command["spans"] if span.split()}
    assert {"up", "down"} <= actions_named, actions_named


def test_train_entrypoint_options_are_accepted():
    from atlas_core.cli.train import USAGE

    options = documented_commands()["atlas_core.cli.train"]["options"]
    assert "--print-config" in options
    unknown = sorted(set(options) - _options_in_help(USAGE) - {"-h", "--help"})
    assert not unknown, f"README lists `python -m atlas_core.cli.train` options it does not take: {unknown}"


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
    exported = trainer | operator
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


def test_readme_names_exactly_the_exported_teaching_figures():
    from atlas_core.telemetry.metrics import LOG_KEY_GAUGES

    exported_keys = {k for k in LOG_KEY_GAUGES if k.startswith("teaching/")}
    teaching = section(doc("README.md"), "Teacher training (adaptive dual-agent teaching)")
    exported_part = teaching.split("exported to Prometheus", 1)[1].split("only logged", 1)[0]
    named = set(re.findall(r"`(teaching/\w+)`", exported_part))
    assert named == exported_keys, f"README says {sorted(named)} are exported; the code exports {sorted(exported_keys)}"
    for key, gauge in LOG_KEY_GAUGES.items():
        if key.startswith("teaching/"):
            assert f"`{gauge.describe()[0].name}`" in exported_part


def test_ports_in_the_docs_are_the_code_ports():
    from atlas_contract import names

    ports = {names.TRAINER_METRICS_PORT, names.OPERATOR_METRICS_PORT, names.VLLM_PORT, names.WEIGHT_SYNC_PORT}
    for name in ("README.md", "docs/architecture.md"):
        cited = {int(p) for p in re.findall(r"(?::|port |sync )(\d{4,5})\b", doc(name))}
        assert cited <= ports, f"{name} cites ports the code does not use: {sorted(cited - ports)}"
        assert ports <= cited, f"{name} does not cite the ports {sorted(ports - cited)}"
    assert _subparsers()["demo"].get_default("metrics_port") == names.TRAINER_METRICS_PORT


# --------------------------------------------------------------------------- the facts fixed by hand


def test_demo_time_is_one_figure():
    text = "\n".join(doc(n) for n in DOC_FILES)
    assert "~2 min" not in text and "1.5 minutes" not in text
    assert text.count("about 5 minutes on 2 cores") + text.count("About 5 minutes on 2 cores") >= 2


def test_current_kl_at_beta_zero_is_documented_as_the_code_sets_it():
    source = (REPO / "atlas_core/training/algorithms/grpo.py").read_text()
    assert "[0.0]" in source  # the trainer stores tensor([0.]) when TRL logged no KL (beta == 0)
    for name in ("README.md", "docs/trainers.md"):
        text = " ".join(doc(name).split())
        assert "`tensor([0.])` when `beta == 0`" in text, name
        assert "empty when `beta == 0`" not in text


def test_namespaced_rbac_cluster_role_is_described_as_the_chart_grants_it():
    import yaml

    rules = yaml.safe_load((REPO / "charts/atlas-operator/files/rbac-rules.yaml").read_text())
    cluster_rules = rules["cluster"] + rules["allNamespaces"]
    for name in ("README.md", "docs/architecture.md"):
        text = " ".join(doc(name).split())
        assert "only reads CRDs" not in text
        for rule in cluster_rules:
            for resource in rule["resources"]:
                word = {
                    "customresourcedefinitions": "CustomResourceDefinitions",
                    "namespaces": "Namespaces",
                    "clustertrainingruntimes": "ClusterTrainingRuntimes",
                }[resource]
                verbs = "/".join(f"`{v}`" for v in rule["verbs"])
                assert f"{verbs} {word}" in text, f"{name}: the namespaced ClusterRole's {verbs} on {word}"


def test_jobset_backend_facts_are_the_codes():
    """The JobSet run-name limits, the JobSet install command and the chart values the docs give."""
    import yaml
    from atlas_operator.reconcile import JOB_CRDS

    from atlas_contract.names import MAX_RUN_NAME, max_jobset_run_name

    readme = " ".join(doc("README.md").split())
    limits = re.search(r"at most (\d+) characters up to 10 nodes, (\d+) up to 100 and (\d+) up to 1,000", readme)
    assert limits, "README: the JobSet run-name limits"
    assert [int(n) for n in limits.groups()] == [max_jobset_run_name(n) for n in (10, 100, 1000)]
    assert max_jobset_run_name(1) == max_jobset_run_name(10) > max_jobset_run_name(11) == max_jobset_run_name(100)
    assert f"PyTorchJob runs may have {MAX_RUN_NAME}" in readme
    architecture = " ".join(doc("docs/architecture.md").split())
    assert f"at most {MAX_RUN_NAME} characters | at most {max_jobset_run_name(10)} up to 10 nodes" in architecture

    values = yaml.safe_load((REPO / "charts/atlas-operator/values.yaml").read_text())
    for name in ("README.md", "docs/architecture.md"):
        text = doc(name)
        installs = re.findall(r"kubectl apply --server-side -f \S*jobset\S*manifests\.yaml", text)
        assert installs, f"{name}: how to install JobSet"
        for install in installs:
            assert install in JOB_CRDS["JobSet"][2], f"{name}: {install} is not what the operator tells users"
        for key in re.findall(r"(?<![\w/.-])operator\.(\w+)", text):
            assert key in values["operator"], f"{name}: chart value operator.{key} does not exist"
    assert "`operator.defaultBackend`" in readme and values["operator"]["defaultBackend"] == "PyTorchJob"
    assert "not rendered yet" not in readme and "only `PyTorchJob` is rendered" not in architecture


def test_rollout_and_watchdog_facts_are_the_codes():
    """What the docs say of the rollout server, colocate and the step watchdog: the rendered server command, the
    defaults that apply and the names (exit code, JobSet rule and reason, Event, the reason's mark) the code uses."""
    import shlex

    from atlas_operator import spec
    from atlas_operator.cli import parse_file
    from atlas_operator.render import Images, rollout_pod_template, rollout_server_command
    from atlas_operator.schema import camel
    from atlas_operator.status import WATCHDOG_RESTART_REASON, WATCHDOG_RESTART_RULE

    from atlas_contract import defaults, names

    readme = " ".join(doc("README.md").split())
    architecture = " ".join(doc("docs/architecture.md").split())
    (run,) = parse_file(str(REPO / "examples/grpo-run.yaml"))
    command = rollout_server_command(run)
    container = rollout_pod_template(run, Images())["spec"]["containers"][0]

    # The server's flags as the README quotes them, each with its value where it gives one.
    quoted = re.search(r"`vllm serve <model> (.*?)` with `VLLM_SERVER_DEV_MODE=1`", readme)
    assert quoted, "README: the rollout server's command"
    tokens = shlex.split(quoted.group(1).replace("…", ""))
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            assert token in command, f"README: the rollout server runs {token}; the rendered command has none"
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                assert command[command.index(token) + 1] == tokens[i + 1], f"README: {token} {tokens[i + 1]}"
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    for text in (readme, architecture):
        assert f"vLLM {names.ROLLOUT_VLLM_VERSION}" in text
        assert "trl vllm-serve` rollout" not in text and "`trl vllm-serve`:" not in text

    # spec.rollout.mode colocate: its defaults and the server-only fields it rejects.
    assert f"`gpuMemoryUtilization` defaults to {spec.SERVER_GPU_MEMORY_UTILIZATION:g}" in readme
    assert f"(`gpuMemoryUtilization`, default {spec.COLOCATED_GPU_MEMORY_UTILIZATION:g}:" in readme
    server_only = re.search(r"a server-only field \(([^)]*)\)", readme).group(1)
    assert re.findall(r"`(\w+)`", server_only) == [camel(f) for f in spec.SERVER_ONLY_ROLLOUT_FIELDS]

    # The step watchdog: its defaults on the cluster and in the Python API, its exit and its names.
    step = defaults.TRAINING_COMMON["step_timeout_seconds"]
    assert f"`spec.training.stepTimeoutSeconds` (default {step:g} on the cluster" in readme
    assert defaults.first_step_timeout(1) == defaults.FIRST_STEP_MIN_S and defaults.first_step_timeout(1e4) == 4e4
    assert f"4 times as long, at least {defaults.FIRST_STEP_MIN_S:g} s" in readme
    assert f"4 times it, at least {defaults.FIRST_STEP_MIN_S:g} s" in architecture
    for text in (readme, architecture):
        assert f"code {names.WATCHDOG_EXIT_CODE}" in text and f"`{WATCHDOG_RESTART_RULE}`" in text
    assert f"`server_timeout_seconds` ({defaults.SERVER_TIMEOUT_S:g} s)" in readme
    assert f"`server_timeout_seconds` ({defaults.SERVER_TIMEOUT_S:g})" in architecture
    assert f"`{WATCHDOG_RESTART_REASON}`" in readme and f"`{names.WATCHDOG_MARK}`" in readme
    config = ast.parse((REPO / "atlas_core/training/algorithms/grpo_config.py").read_text())
    (field,) = [
        node.value
        for node in ast.walk(config)
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "step_timeout_seconds"
    ]
    assert [ast.literal_eval(k.value) for k in field.keywords if k.arg == "default"] == [0.0]
    assert "`step_timeout_seconds` (default 0 = off)" in readme
    assert "no optimizer step completed in" in (REPO / "atlas_core/training/watchdog.py").read_text()
    assert '"WatchdogRestart"' in (REPO / "operator/atlas_operator/reconcile/reconciler.py").read_text()
    assert "Event `WatchdogRestart`" in readme and "Event `WatchdogRestart`" in architecture
