"""One contract, no drift: the documented default of every spec field is the one that applies, the operator loads
without the training library, and the exported metrics are the contract's list. That the two halves import only the
contract is lint-imports' to check (pyproject.toml, [tool.importlinter]; make test)."""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from atlas_operator.manifests import render_children
from atlas_operator.schema import camel, unwrap_optional
from atlas_operator.spec import AtlasTeacherSpec, AtlasTrainingSpec
from atlas_operator.validation import parse_run

from atlas_contract import metrics as contract_metrics
from atlas_contract.errors import InvalidFields
from atlas_contract.names import RUN_CONFIG_FILE
from tests.support.cel_admission import crd_schema

REPO = Path(__file__).resolve().parents[2]
SPEC_TYPES = {"AtlasTraining": AtlasTrainingSpec, "AtlasTeacher": AtlasTeacherSpec}

# A minimal valid manifest of each kind (and algorithm): the base every field is varied on.
BASE = {
    ("AtlasTraining", "grpo"): {"model": "org/policy", "dataset": {"source": "builtin://arithmetic"}},
    ("AtlasTraining", "sft"): {
        "model": "org/policy",
        "algorithm": "sft",
        "dataset": {"source": "builtin://arithmetic"},
    },
    ("AtlasTeacher", "teacher"): {
        "model": "org/teacher",
        "dataset": {"source": "builtin://arithmetic"},
        "student": {"model": "org/student"},
    },
}
# Fields that only exist inside an optional object: the object the base needs for them to apply.
CONTEXT = {
    "spec.reward.configMapRef.key": {"reward": {"configMapRef": {"name": "my-judges"}}},
    "spec.evaluation.dataset.split": {"evaluation": {}},
    "spec.evaluation.samples": {"evaluation": {}},
    "spec.output.merge": {"output": {"uri": "s3://out/run"}},
    **{f"spec.training.lora.{name}": {"training": {"lora": {}}} for name in ("r", "alpha", "dropout", "targetModules")},
}


def manifest(kind: str, spec: dict) -> dict:
    return {"apiVersion": "atlas.arc.computer/v1alpha1", "kind": kind, "metadata": {"name": "r"}, "spec": spec}


def leaf_fields(cls, prefix="spec."):
    """(API path, dataclass field, Python type) of every leaf field, list items as ``[]``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        annotation, path = unwrap_optional(hints[f.name]), prefix + camel(f.name)
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
        if dataclasses.is_dataclass(annotation):
            yield from leaf_fields(annotation, path + ".")
        elif item is not None and dataclasses.is_dataclass(item):
            yield from leaf_fields(item, path + "[].")
        else:
            yield path, f, annotation


def crd_description(kind: str, path: str) -> str:
    """What ``kubectl explain <kind>.<path>`` shows: the description in the generated CRD file."""
    schema = crd_schema(kind)  # parsed once per kind: this runs for every field, many times per test
    for part in path.split("."):
        if part.endswith("[]"):
            schema = schema["properties"][part[:-2]]["items"]
        else:
            schema = schema["properties"][part]
    return schema["description"]


def documented_defaults(description: str, annotation) -> dict[str, object] | None:
    """The default a description states, per algorithm ({"*": v} when it is the same for all); None when
    it states none. Parsed from the text users read, not from the code."""
    match = re.search(r"Default: (.+?)\.(?: |$)", description)
    if match is None:
        return None
    text = match.group(1)
    per_algorithm = re.fullmatch(r"(\S+) \(grpo, AtlasTeacher\), (\S+) \(sft\)", text)
    if per_algorithm:
        grpo = _value(per_algorithm.group(1), annotation)
        return {"grpo": grpo, "teacher": grpo, "sft": _value(per_algorithm.group(2), annotation)}
    if text == "empty":
        return {"*": [] if typing.get_origin(annotation) is list else {}}
    return {"*": _value(text, annotation)}


def _value(text: str, annotation):
    if annotation is bool:
        return {"true": True, "false": False}[text]
    if annotation in (int, float):
        return annotation(float(text)) if annotation is float else int(text)
    if typing.get_origin(annotation) is list:  # as YAML writes it: [all-linear]
        return yaml.safe_load(text)
    return text


def set_path(spec: dict, path: str, value) -> dict:
    spec = copy.deepcopy(spec)
    node, parts = spec, path.removeprefix("spec.").split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return spec


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def all_fields():
    seen = {}
    for kind, cls in SPEC_TYPES.items():
        for path, f, annotation in leaf_fields(cls):
            seen.setdefault((kind, path), (f, annotation))
    return seen


def test_every_field_documents_what_unset_means():
    """Each field of both kinds is required, has a default stated in its description, or says what
    leaving it unset means; no description carries a hand-written default that could drift."""
    undocumented = []
    for (kind, path), (f, annotation) in all_fields().items():
        description = crd_description(kind, path)
        stated = documented_defaults(description, annotation) is not None or "Unset: " in description
        if not (f.metadata["required"] or stated):
            undocumented.append(f"{kind} {path}")
        assert not re.search(r"\(default", f.metadata["doc"]), f"{path}: a default written by hand in its doc"
    assert undocumented == []


@pytest.mark.parametrize("kind, algorithm", list(BASE))
def test_documented_default_is_what_renders(kind, algorithm):
    """Setting a field explicitly to its documented default renders exactly what leaving it unset renders
    (the operator applies that default, not another one), for every field with a stated default."""
    checked, wrong = 0, []
    for (field_kind, path), (_, annotation) in all_fields().items():
        if field_kind != kind or "[]" in path:
            continue
        stated = documented_defaults(crd_description(kind, path), annotation)
        if stated is None:
            continue
        if "GRPO only" in crd_description(kind, path) and algorithm == "sft":
            continue
        value = stated.get(algorithm, stated.get("*"))
        base = merge(BASE[(kind, algorithm)], CONTEXT.get(path, {}))
        if algorithm == "sft" and path in ("spec.algorithm", "spec.rollout.replicas"):
            continue  # the sft base sets the algorithm; an sft run has no rollout server (see the field's doc)
        unset = render_children(parse_run(manifest(kind, base)))
        explicit = render_children(parse_run(manifest(kind, set_path(base, path, value))))
        checked += 1
        if explicit != unset:
            wrong.append(f"{path}: documented default {value!r} renders differently from unset")
    assert wrong == []
    assert checked >= 20


def _trainer_config(kind: str, spec: dict, tmp_path: Path):
    """The trainer configuration object a pod builds from the rendered run.yaml (the real loader and the
    real GRPOConfig/SFTConfig), and the loaded run configuration."""
    from atlas_core.training.load_config import load_run_config, trainer_config_class, trainer_kwargs

    children = render_children(parse_run(manifest(kind, spec)))
    config_map = next(c for c in children if c["kind"] == "ConfigMap")
    run_file = tmp_path / RUN_CONFIG_FILE
    run_file.write_text(config_map["data"][RUN_CONFIG_FILE])
    cfg = load_run_config([f"recipe={run_file}"])
    kwargs = {**trainer_kwargs(cfg), "output_dir": str(tmp_path / "out")}
    return trainer_config_class(cfg.algorithm)(**kwargs), cfg


# Spec fields that reach the trainer under another name or place than spec.training.<field> (transformers
# reads activation_checkpointing; gradient_checkpointing is its deprecated alias).
TRAINER_ATTRIBUTE = {
    "spec.checkpoint.saveSteps": "save_steps",
    "spec.training.gradientCheckpointing": "activation_checkpointing",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind, algorithm", list(BASE))
def test_documented_default_is_what_the_trainer_uses(kind, algorithm, tmp_path):
    """For every trainer-facing field (spec.training.*, spec.teaching.*, checkpoint.saveSteps, dataset.split)
    the value the real trainer configuration holds equals the default ``kubectl explain`` states."""
    from atlas_contract.lora import LoraSettings

    base = set_path(BASE[(kind, algorithm)], "spec.resources.gpusPerNode", 0)  # this machine has no GPU
    args, cfg = _trainer_config(kind, base, tmp_path)
    # spec.training.lora's settings apply to a run that has it: the trainer's own, read as the contract reads them.
    (tmp_path / "lora").mkdir()
    lora_args, _ = _trainer_config(kind, merge(base, {"training": {"lora": {}}}), tmp_path / "lora")
    trainer_lora = LoraSettings.parse(lora_args.lora, "lora")[0]
    checked, wrong = 0, []
    for (field_kind, path), (f, annotation) in all_fields().items():
        if field_kind != kind:
            continue
        section = path.split(".")[1]
        trainer_facing = section in ("training", "teaching") or path in TRAINER_ATTRIBUTE
        if path == "spec.training.extra" or not (trainer_facing or path == "spec.dataset.split"):
            continue
        description = crd_description(kind, path)
        stated = documented_defaults(description, annotation)
        if stated is None or ("GRPO only" in description and algorithm == "sft"):
            continue
        expected = stated.get(algorithm, stated.get("*"))
        if path == "spec.dataset.split":
            actual = cfg.dataset.split
        elif path.startswith("spec.training.lora."):
            expected = getattr(LoraSettings.parse({f.name: expected}, "lora")[0], f.name)  # [all-linear]: all-linear
            actual = getattr(trainer_lora, f.name)
        else:
            actual = getattr(args, TRAINER_ATTRIBUTE.get(path, f.name))
        actual = getattr(actual, "value", actual)  # transformers' enums (lr_scheduler_type)
        checked += 1
        if actual != expected:
            wrong.append(f"{path}: kubectl explain says {expected!r}, the trainer uses {actual!r}")
    assert wrong == []
    assert checked >= (12 if algorithm == "sft" else 20)


@pytest.mark.parametrize(("gpus", "bf16", "processes"), [(0, False, "1"), (8, True, "8")])
def test_derived_defaults(gpus, bf16, processes):
    """bf16 and processesPerNode: 'Unset' follows gpusPerNode as their descriptions say."""
    base = set_path(BASE[("AtlasTraining", "grpo")], "spec.resources.gpusPerNode", gpus)
    base = set_path(base, "spec.training.perDeviceTrainBatchSize", 8)
    children = render_children(parse_run(manifest("AtlasTraining", base)))
    config_map = next(c for c in children if c["kind"] == "ConfigMap")
    job = next(c for c in children if c["kind"] == "PyTorchJob")
    assert yaml.safe_load(config_map["data"][RUN_CONFIG_FILE])["trainer"]["bf16"] is bf16
    assert job["spec"]["nprocPerNode"] == processes
    description = crd_description("AtlasTraining", "spec.resources.processesPerNode")
    assert "gpusPerNode (1 when gpusPerNode is 0)" in description


def test_teaching_and_telemetry_docstrings_state_the_real_defaults():
    """GRPOConfig's docstrings (TRL style, ``defaults to `X```) state each Atlas field's real default."""
    from atlas_core.training.algorithms.grpo_config import AtlasArguments, TeachingArguments

    for cls in (AtlasArguments, TeachingArguments):
        documented = dict(re.findall(r"(\w+) \(`\w+`, \*optional\*, defaults to `([^`]+)`\)", cls.__doc__))
        for f in dataclasses.fields(cls):
            if f.name not in documented:
                continue
            shown = documented[f.name].strip('"')
            assert shown in (str(f.default), f"{f.default:g}" if isinstance(f.default, float) else None), (
                f"{cls.__name__}.{f.name}: docstring says {shown}, the field defaults to {f.default!r}"
            )


# --------------------------------------------------------------------------- one contract


def test_operator_loads_without_the_training_library():
    """The operator's modules (what the operator image runs) load no training library."""
    code = (
        "import sys, atlas_operator.cli, atlas_operator.handlers, atlas_operator.generate\n"
        "heavy = sorted(m for m in ('atlas_core', 'torch', 'trl', 'transformers', 'deepspeed') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_one_error_type_for_wrong_fields():
    from atlas_contract.errors import InvalidFields
    from atlas_core.training.load_config import load_run_config

    with pytest.raises(InvalidFields) as operator_side:
        parse_run(manifest("AtlasTraining", {"model": 3}))
    with pytest.raises(InvalidFields) as trainer_side:
        load_run_config(["recipe=no_such_recipe"])
    assert type(operator_side.value) is type(trainer_side.value) is InvalidFields  # one type, one name
    assert operator_side.value.problems[0].startswith("spec.model: expected a string")
    assert trainer_side.value.problems[0].startswith("recipe: unknown recipe")


def test_exported_metrics_are_the_contracts_list():
    """Both registries export exactly the contract's metrics, with its types and help texts."""
    from atlas_operator.metrics import REGISTRY

    from atlas_core.telemetry.metrics import TRAINER_REGISTRY

    for registry, declared in ((TRAINER_REGISTRY, contract_metrics.TRAINER), (REGISTRY, contract_metrics.OPERATOR)):
        families = {f.name: f for f in registry.collect()}
        assert set(families) == {m.name for m in declared}
        for metric in declared:
            assert families[metric.name].type == metric.type
            assert families[metric.name].documentation == metric.help
    from atlas_core.telemetry.metrics import exported_metric_names

    assert exported_metric_names() == contract_metrics.exported_names(contract_metrics.TRAINER)


def test_render_prints_plain_manifests(tmp_path):
    """``atlas render`` output has no YAML anchors or aliases, even where two objects share a value (the
    Master and Worker pod templates of a multi-node run)."""
    spec = merge(BASE[("AtlasTeacher", "teacher")], {"resources": {"nodes": 3, "gpusPerNode": 8}})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest("AtlasTeacher", spec)))
    proc = subprocess.run(
        [sys.executable, "-m", "atlas_cli.main", "render", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"(^|[\s:\-\[,])[&*]id\d+", proc.stdout), "YAML anchors/aliases in atlas render output"
    events = [type(e).__name__ for e in yaml.parse(proc.stdout)]
    assert "AliasEvent" not in events
    job = [d for d in yaml.safe_load_all(proc.stdout) if d["kind"] == "PyTorchJob"][0]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Worker"]["replicas"] == 2
    assert replicas["Master"]["template"] == replicas["Worker"]["template"]


def test_operator_owned_trainer_fields_are_exactly_what_the_operator_writes():
    """Every trainer field run.yaml gets from somewhere other than spec.training is refused in
    spec.training.extra (it would be overwritten without a word), and the list holds nothing else."""
    from atlas_operator.render import run_config
    from atlas_operator.spec import TrainingSpec
    from atlas_operator.validation import OPERATOR_OWNED_TRAINER_FIELDS

    spec_fields = {f.name for f in dataclasses.fields(TrainingSpec)} - {"extra"}
    written = set()
    for kind, algorithm in BASE:
        config = run_config(parse_run(manifest(kind, BASE[(kind, algorithm)])))
        written |= set(config["trainer"]) - spec_fields
        written |= {"output_dir", "run_name"} & set(config)
    colocated = set_path(BASE[("AtlasTeacher", "teacher")], "spec.rollout", {"mode": "colocate", "maxModelLen": 512})
    colocated = set_path(colocated, "spec.resources", {"gpusPerNode": 1})
    written |= set(run_config(parse_run(manifest("AtlasTeacher", colocated)))["trainer"]) - spec_fields
    assert written == set(OPERATOR_OWNED_TRAINER_FIELDS)
    for name in OPERATOR_OWNED_TRAINER_FIELDS:
        spec = set_path(BASE[("AtlasTeacher", "teacher")], "spec.training.extra", {name: 1})
        with pytest.raises(InvalidFields) as caught:
            parse_run(manifest("AtlasTeacher", spec))
        assert caught.value.problems == [
            f"spec.training.extra.{name}: the operator sets it ({OPERATOR_OWNED_TRAINER_FIELDS[name]}); "
            "remove it from extra"
        ]


WRONG = ["x", 3, -1, 1e308, float("nan"), [], {}, None, True, "2 GB", [1, 2], {"a": [1]}, 10**30]


@pytest.mark.parametrize("kind", list(SPEC_TYPES))
def test_validation_never_raises_anything_but_invalid(kind):
    """Every leaf field of the spec given values of every wrong kind: the run parses or is Invalid with the
    problems listed; no other exception (the operator would stop reconciling it) and no unbounded work."""
    base = BASE[(kind, "teacher" if kind == "AtlasTeacher" else "grpo")]
    tried = 0
    for (field_kind, path), _ in all_fields().items():
        if field_kind != kind:
            continue
        for value in WRONG:
            spec = set_path(base, path.replace("[]", ""), [value] if "[]" in path else value)
            if "[]" in path:  # a list of objects: the wrong value inside one item
                head, _, leaf = path.partition("[].")
                spec = set_path(base, head, [{leaf: value}])
            try:
                parse_run(manifest(kind, spec))
            except InvalidFields as invalid:
                assert invalid.problems and all(isinstance(p, str) and ": " in p for p in invalid.problems)
            tried += 1
    assert tried >= 40 * len(WRONG)


def test_extra_values_the_contract_knows_are_checked_and_reported_briefly():
    """spec.training.extra values whose kind the contract knows are checked, and a huge value gives a short
    message (validation runs in the operator's process)."""
    spec = set_path(
        BASE[("AtlasTraining", "grpo")],
        "spec.training.extra",
        {"steps_per_generation": "abc", "generation_batch_size": [1] * 10**6, "save_total_limit": 2},
    )
    with pytest.raises(InvalidFields) as caught:
        parse_run(manifest("AtlasTraining", spec))
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "spec.training.extra.generation_batch_size",
        "spec.training.extra.steps_per_generation",
    ]
    assert all(len(p) < 200 for p in problems) and "expected a whole number" in problems[0]
