"""The CRDs' CEL rules (x-kubernetes-validations) against the operator's validation: one rule, two enforcements.

The API server's side is tests/support/cel_admission.py: the generated CRD files, evaluated with Google's CEL runtime
(cel-expr-python) the way the API server does. The operator's side is parse_run. Over every example, the
upgrade fixtures' stored runs, the test builders' manifests and a generated set of variants, both must refuse
the same fields with the same messages.
"""

from __future__ import annotations

import copy
import functools
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from atlas_operator.cel_rules import CHECKPOINT_FIXED, FIXED, rules_for
from atlas_operator.crd import custom_resource_definition
from atlas_operator.validation import parse_run
from cel_expr_python import cel

from atlas_contract.errors import InvalidFields
from atlas_contract.names import max_jobset_run_name, max_trainjob_run_name
from harness.manifests import teacher, tiny_training, training, with_spec
from tests.support.cel_admission import admission_refusals, crd_schema, is_transition
from tests.support.k8s_schemas import crd_jsonschema, openapi_validate

REPO = Path(__file__).resolve().parents[2]
KINDS = ("AtlasTraining", "AtlasTeacher")


def _runs_in(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") in KINDS]


EXAMPLES = [run for path in sorted((REPO / "examples").glob("*.yaml")) for run in _runs_in(path)]
# Runs as the previous release stored them: an upgrade must not make them invalid.
STORED = [run for path in sorted((REPO / "tests/fixtures/upgrade").glob("*/*.yaml")) for run in _runs_in(path)]
BUILT = [training(), teacher(), tiny_training("tiny-run"), teacher(backend="JobSet"), training(algorithm="sft")]


# A valid value of each GRPO-only spec.training field (atlas_contract.defaults.GRPO_ONLY).
GRPO_ONLY_VALUES = {
    "beta": 0.1,
    "epsilon": 0.3,
    "lossType": "grpo",
    "maxCompletionLength": 256,
    "numGenerations": 4,
    "numIterations": 2,
    "scaleRewards": "batch",
    "temperature": 0.7,
    "topP": 0.9,
}


# Datasets around the builtin rules (atlas_contract.datasets.BUILTINS): known or not, of the algorithm or SFT-only, a
# split the builtin has or not, and a source the rules do not judge.
DATASETS = (
    {"source": "builtin://arithmetic"},
    {"source": "builtin://arithmetic"},
    {"source": "builtin://arithmetic", "split": "test"},
    {"source": "builtin://multistep", "split": "dev"},
    {"source": "builtin://teacher-arithmetic"},
    {"source": "builtin://teacher-multistep", "split": "test"},
    {"source": "builtin://nothing"},
    {"source": "hf://org/data", "split": "whatever"},
    {"source": "s3://data/train.jsonl"},
    {"source": "s3://"},
    {"source": "pvc://"},
    {"source": "hf://"},
)
# URIs around each source rule's edge (atlas_contract/sources.py): valid, and one that cannot be, per scheme.
MODELS = (
    "builtin://tiny-llama",
    "s3://models/tiny",
    "s3://",
    "s3://Bad_Bucket/m",
    "pvc://models/tiny",
    "pvc://",
    "hf://org/model",
    "hf://",
)
OUTPUTS = (
    None,
    {"uri": "s3://out/run"},
    {"uri": "s3://"},
    {"uri": "pvc://out/run"},
    {"uri": "pvc://"},
    {"uri": "hf://org/teacher"},
    {"uri": "hf://"},
    {"uri": "/checkpoints/out"},
)
EVALUATIONS = (
    {},
    {"dataset": {"source": "s3://held-out/test.jsonl"}},
    {"dataset": {"source": "pvc://"}},
    {"dataset": {"source": "s3://x"}},
    {"dataset": {"source": "hf://"}},
    {"samples": 2},
    {"dataset": {"split": "train"}},
    {"dataset": {"split": "dev"}},
    {"dataset": {"source": "builtin://teacher-multistep"}},
    {"dataset": {"source": "builtin://multistep", "split": "validation"}},
    {"dataset": {"source": "builtin://unknown"}},
    {"dataset": {"source": "hf://org/held-out"}},
)


def variants(count: int, seed: int = 33) -> list[dict[str, Any]]:
    """Runs with the fields the rules read set at random to values around each rule's edge."""
    rng = random.Random(seed)

    def pick(*choices: Any) -> Any:
        return copy.deepcopy(rng.choice(choices))

    def some(**fields: tuple) -> dict[str, Any]:
        chosen = {key: pick(*choices) for key, choices in fields.items()}
        return {key: value for key, value in chosen.items() if value is not None}

    runs = []
    for _ in range(count):
        kind = pick(*KINDS)
        manifest = (teacher if kind == "AtlasTeacher" else training)(
            pick("grpo-run", "a" * 44, "a" * 45, "a" * 46, "a" * 48, "a" * 49, "a" * 55, "a" * 56, "Bad-name", "1-run")
        )
        spec = manifest["spec"]
        spec["training"] = some(perDeviceTrainBatchSize=(4,), numGenerations=(None, 4), maxSteps=(10,))
        spec["training"].update(pick({}, {}, *({key: value} for key, value in GRPO_ONLY_VALUES.items())))
        spec["training"].update(pick({}, {}, {}, {}, {"extra": {}}, {"extra": {"steps_per_generation": 2}}))
        spec["dataset"] = pick(*DATASETS)
        spec["model"] = pick(*MODELS)
        spec["output"] = pick(*OUTPUTS)
        if kind == "AtlasTraining":
            spec["algorithm"] = pick(None, "grpo", "sft")
        rollout = some(
            mode=(None, None, "server", "colocate"),
            replicas=(None, 0, 1, 2),
            gpus=(None, 1, 2, 3, 4),
            tensorParallelSize=(None, 1, 2, 3),
            enableSleepMode=(None, None, True),
            args=(None, None, [], ["--enforce-eager"]),
            image=(None, None, "vllm/vllm-openai:v0.30.0"),
            cpu=(None, None, "8"),
            memory=(None, None, "64Gi"),
        )
        if len(runs) % 5 == 0:  # set apart from the draws above, which the corpus's other fields follow
            rollout["cacheSize"] = "16Gi"
        spec["rollout"] = rollout
        spec["resources"] = some(
            nodes=(None, 1, 3, 12), gpusPerNode=(None, 0, 1, 2, 4, 8), processesPerNode=(None, None, 1, 2, 3, 8)
        )
        spec["reward"] = some(
            funcs=(None, None, [], ["exact_match"], ["exact_match", "boxed_format"], ["made_up"]),
            weights=(None, None, [], [1.0], [1.0, 0.5], [1.0, 1.0, 1.0]),
            config=(None, None, "interpretation", "made_up"),
            configMapRef=(None, None, {"name": "my-reward"}),
        )
        spec["backend"] = pick(None, "PyTorchJob", "JobSet", "TrainJob")
        spec["automountServiceAccountToken"] = pick(None, None, False, True)
        spec["env"] = pick(
            [],
            [{"name": "KEY", "value": "v"}],
            [{"name": "PET_NNODES", "value": "2"}],
            [{"name": "A", "value": "1"}, {"name": "KEY", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s"}}}],
        )
        if kind == "AtlasTeacher":
            spec["evaluation"] = pick(None, None, *EVALUATIONS)
            spec["student"]["model"] = pick(*MODELS)
            spec["student"]["rollout"] = some(
                replicas=(None, 0, 1, 2, 3), gpus=(None, 1, 2, 3), tensorParallelSize=(1, 2)
            )
        for key in [k for k, v in spec.items() if v is None]:
            del spec[key]
        runs.append(manifest)
    return runs


# spec.training.lora around each bound and rule (atlas_contract/lora.py): the schema's ranges (r >= 1, alpha > 0,
# 0 <= dropout < 1), the CEL rules on targetModules, and valid ones; the operator's problem for each (None: valid).
LORAS = {
    "r-0": ({"r": 0}, "spec.training.lora.r: expected a number >= 1, got 0"),
    "alpha-0": ({"alpha": 0}, "spec.training.lora.alpha: expected a number > 0, got 0.0"),
    "dropout-1": ({"dropout": 1}, "spec.training.lora.dropout: expected a number < 1, got 1.0"),
    "dropout-negative": ({"dropout": -0.1}, "spec.training.lora.dropout: expected a number >= 0, got -0.1"),
    "no-targets": (
        {"targetModules": []},
        "spec.training.lora.targetModules: expected [all-linear] or at least one module name, got []",
    ),
    "all-linear-and-one": (
        {"targetModules": ["all-linear", "q_proj"]},
        "spec.training.lora.targetModules: 'all-linear' stands alone (it already names every linear layer but the "
        "output head), got 'all-linear' with 'q_proj'",
    ),
    "all-linear-and-three": (
        {"targetModules": ["q_proj", "all-linear", "k_proj", "v_proj"]},
        "spec.training.lora.targetModules: 'all-linear' stands alone (it already names every linear layer but the "
        "output head), got 'all-linear' with 'q_proj' and 2 more",
    ),
    "all-linear-twice": (
        {"targetModules": ["all-linear", "all-linear"]},
        "spec.training.lora.targetModules: 'all-linear' stands alone (it already names every linear layer but the "
        "output head), got 'all-linear' with 'all-linear' again",
    ),
    "blank-target": (
        {"targetModules": ["q_proj", " "]},
        "spec.training.lora.targetModules: expected module names, none blank, got ' '",
    ),
    "valid": ({"r": 8, "alpha": 16, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"]}, None),
    "defaults": ({}, None),
    "all-linear": ({"targetModules": ["all-linear"], "dropout": 0.5}, None),
}


def lora_run(case: str, kind: str) -> dict[str, Any]:
    """A run of ``kind`` with LORAS[case]'s spec.training.lora."""
    manifest = (teacher if kind == "AtlasTeacher" else training)(f"lora-{case}")
    manifest["spec"]["training"]["lora"] = copy.deepcopy(LORAS[case][0])
    return manifest


# spec.tracking.mlflow.uri (atlas_contract/tracking.py): a server, https, a file store; not another scheme, not a
# scheme alone, no space.
_EXPECTED_URI = "spec.tracking.mlflow.uri: expected an http://, https:// or file: URI of an MLflow tracking store, got "
TRACKINGS = {
    "server": ({"mlflow": {"uri": "http://mlflow.monitoring:5000"}}, None),
    "https-experiment": ({"mlflow": {"uri": "https://mlflow.example.com/", "experiment": "teachers"}}, None),
    "file-store": ({"mlflow": {"uri": "file:/checkpoints/mlruns"}}, None),
    "wandb-only": ({"wandb": {"project": "atlas", "secretRef": {"name": "wandb"}}}, None),
    "ftp": ({"mlflow": {"uri": "ftp://mlflow:21"}}, _EXPECTED_URI + "'ftp://mlflow:21'"),
    "host-only": ({"mlflow": {"uri": "mlflow:5000"}}, _EXPECTED_URI + "'mlflow:5000'"),
    "scheme-alone": ({"mlflow": {"uri": "http://"}}, _EXPECTED_URI + "'http://'"),
    "space": ({"mlflow": {"uri": "http://mlflow .ns:5000"}}, _EXPECTED_URI + "'http://mlflow .ns:5000'"),
}


def tracking_run(case: str, kind: str) -> dict[str, Any]:
    """A run of ``kind`` with TRACKINGS[case]'s spec.tracking."""
    manifest = (teacher if kind == "AtlasTeacher" else training)(f"tracking-{case}")
    manifest["spec"]["tracking"] = copy.deepcopy(TRACKINGS[case][0])
    return manifest


CORPUS = [
    *EXAMPLES,
    *STORED,
    *BUILT,
    *(lora_run(case, kind) for case in LORAS for kind in KINDS),
    *(tracking_run(case, kind) for case in TRACKINGS for kind in KINDS),
    *variants(700),
]


def cel_visible(manifest: dict[str, Any], problems: list[str]) -> list[str]:
    """The operator's problems that the CRD's rules can see: not spec.training.extra's, nor the generation batch of a
    run that sets extra (which enters the batch), both the operator's alone (validation.validate_run)."""
    extra_set = (manifest["spec"].get("training") or {}).get("extra") is not None
    return [
        p
        for p in problems
        if not p.startswith("spec.training.extra")
        and not (extra_set and " does not divide the generation batch " in p)
        and not p.startswith("spec.reward.weights[")  # a weight that is not finite: JSON carries none
    ]


@functools.cache
def _jsonschema(kind: str) -> dict[str, Any]:
    return crd_jsonschema(custom_resource_definition(kind))


def schema_valid(manifest: dict[str, Any]) -> bool:
    try:
        openapi_validate(manifest, _jsonschema(manifest["kind"]))
    except Exception:  # noqa: BLE001 - the API server refuses it before any rule: not a parity case
        return False
    return True


def disagreements(corpus: list[dict[str, Any]], schemas: dict[str, dict] | None = None) -> list[str]:
    """Each manifest where the CRD's rules and the operator refuse different things."""
    schemas = schemas or {kind: crd_schema(kind) for kind in KINDS}
    found = []
    for manifest in corpus:
        if not schema_valid(manifest):
            continue
        schema = schemas[manifest["kind"]]
        by_cel = sorted(r.as_problem() for r in admission_refusals(manifest, schema=schema))
        try:
            parse_run(manifest)
            problems = []
        except InvalidFields as invalid:
            problems = invalid.problems
        by_operator = sorted(cel_visible(manifest, problems))
        if by_cel != by_operator:
            found.append(
                f"{manifest['metadata']['name']} {manifest['spec']}:\n  CEL {by_cel}\n  operator {by_operator}"
            )
    return found


def test_the_crd_rules_and_the_operator_agree_on_every_manifest():
    assert len([m for m in CORPUS if schema_valid(m)]) > 400
    assert disagreements(CORPUS) == []


def test_every_rule_is_met_and_broken_by_some_manifest():
    """Each rule is exercised both ways by the parity corpus (a rule never broken proves nothing)."""
    for kind in KINDS:
        runs = [m for m in CORPUS if m["kind"] == kind and schema_valid(m)]
        broken = {r.rule for m in runs for r in admission_refusals(m)}
        rules = [v["rule"] for v in _validations(crd_schema(kind)) if not is_transition(v["rule"])]
        assert sorted(set(rules) - broken) == [], f"{kind}: rules no manifest breaks {sorted(set(rules) - broken)}"
        for rule in rules:  # and met: some valid run passes it
            assert any(rule not in {r.rule for r in admission_refusals(m)} for m in runs[:50])


@pytest.mark.parametrize("case", list(LORAS))
def test_lora_settings_are_refused_by_the_schema_or_a_rule_with_the_value_found(case):
    """spec.training.lora: r, alpha and dropout out of range are the schema's to refuse (the API server's "Invalid
    value: 0: spec.training.lora.r in body should be greater than or equal to 1"), targetModules the CEL rules'
    (the same message from the API server and the operator); a valid one passes both and the contract."""
    for kind in KINDS:
        manifest, expected = lora_run(case, kind), LORAS[case][1]
        try:
            run, problems = parse_run(manifest), []
        except InvalidFields as invalid:
            run, problems = None, invalid.problems
        assert problems == ([expected] if expected else [])
        by_cel = [r.as_problem() for r in admission_refusals(manifest)]
        if case in ("r-0", "alpha-0", "dropout-1", "dropout-negative"):
            assert not schema_valid(manifest) and by_cel == []
        else:
            assert schema_valid(manifest) and by_cel == problems
        if run is not None:
            assert run.spec.training.lora.settings()[1] == []


@pytest.mark.parametrize("case", list(TRACKINGS))
def test_a_tracking_uri_is_refused_at_apply_with_the_value_found(case):
    """spec.tracking.mlflow.uri: the same message from the CRD's rule (what the API server answers) and the operator,
    naming the field and the value; a server, https and file: pass."""
    for kind in KINDS:
        manifest, expected = tracking_run(case, kind), TRACKINGS[case][1]
        try:
            parse_run(manifest)
            problems = []
        except InvalidFields as invalid:
            problems = invalid.problems
        assert problems == ([expected] if expected else [])
        assert schema_valid(manifest)
        assert [r.as_problem() for r in admission_refusals(manifest)] == problems


def test_examples_and_stored_runs_pass_every_rule():
    for manifest in [*EXAMPLES, *STORED, *BUILT[:4]]:
        assert admission_refusals(manifest) == [], manifest["metadata"]["name"]


def test_the_parity_check_fails_when_one_side_changes():
    """The CRD's rule for the rollout server's GPUs weakened to `true`: the parity check notices."""
    schemas = {kind: copy.deepcopy(crd_schema(kind)) for kind in KINDS}
    for validation in _validations(schemas["AtlasTraining"]):
        if validation.get("fieldPath") == ".rollout.gpus" and "tensorParallelSize" in validation["message"]:
            validation["rule"] = "true"
    broken = with_spec(training(), rollout={"replicas": 1, "gpus": 3, "tensorParallelSize": 2})
    assert len(disagreements([broken], schemas)) == 1
    assert disagreements([broken]) == []


@pytest.mark.parametrize(
    ("backend", "max_run_name"), [("JobSet", max_jobset_run_name), ("TrainJob", max_trainjob_run_name)]
)
def test_the_name_rule_is_the_pod_name_limit(backend, max_run_name):
    """metadata.name on JobSet and TrainJob: the rule's arithmetic is names.max_jobset_run_name (the JobSet's pods
    <name>-trainer-0-<node>-<5>) or names.max_trainjob_run_name (the Trainer's, <name>-node-0-<node>-<5>) for every
    node count."""
    for nodes in (1, 2, 10, 11, 100, 101):
        limit = max_run_name(nodes)
        for length in (limit, limit + 1):
            manifest = training("a" * length, backend=backend, resources={"nodes": nodes, "gpusPerNode": 8})
            refused = [r for r in admission_refusals(manifest) if backend in r.message]
            assert bool(refused) == (length > limit), (nodes, length)


def test_the_operator_checks_the_jobset_rules_with_its_default_backend():
    """spec.backend unset: the API server cannot know the operator's default, the operator can."""
    manifest = teacher(student={"model": "m/s", "rollout": {"replicas": 3}})
    assert admission_refusals(manifest) == []
    assert parse_run(manifest).backend == "PyTorchJob"
    with pytest.raises(InvalidFields) as invalid:
        parse_run(manifest, default_backend="JobSet")
    assert [p.split(":")[0] for p in invalid.value.problems] == ["spec.student.rollout.replicas"]


# ------------------------------------------------------------------ transition rules

# A change of each field a checkpoint fixes, and of fields a running run takes (the operator recreates the job).
FIXED_CHANGES = {
    "model": "Qwen/Qwen2.5-1.5B-Instruct",
    "dataset": {"source": "builtin://arithmetic", "split": "test"},
    "reward": {"funcs": ["exact_match"]},
    "training.learningRate": 3e-6,
    "training.lrSchedulerType": "cosine",
    "training.warmupSteps": 10.0,
    "training.weightDecay": 0.1,
    "training.seed": 7,
    "training.lora": {"r": 4},
}
TAKEN_CHANGES = {
    "training.maxSteps": 1000,
    "training.beta": 0.0,
    "backend": "JobSet",  # the operator moves the run (tests/emulator/test_operator_jobset.py)
    "suspend": True,
    "resources.nodes": 2,
    "checkpoint.saveSteps": 10,
    "maxRestarts": 5,
}


def _changed(manifest: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    *parents, last = path.split(".")
    node = manifest["spec"]
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value
    return manifest


def _transition_refusals(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    return [r.path for r in admission_refusals(new, old) if is_transition(r.rule)]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda m: m["metadata"]["name"])
def test_a_change_a_checkpoint_fixes_is_refused_on_update(example):
    assert set(FIXED_CHANGES) == set(CHECKPOINT_FIXED)
    assert _transition_refusals(example, example) == []
    for path, value in FIXED_CHANGES.items():
        refused = admission_refusals(_changed(example, path, value), example)
        assert [(r.path, r.message.partition(", got ")[0]) for r in refused] == [(f"spec.{path}", FIXED)], path
    for path, value in TAKEN_CHANGES.items():
        assert _transition_refusals(_changed(example, path, value), example) == [], path
    if example["kind"] == "AtlasTeacher":
        assert _transition_refusals(_changed(example, "student.model", "m/other"), example) == ["spec.student.model"]
    else:
        assert _transition_refusals(_changed(example, "algorithm", "sft"), example) == ["spec.algorithm"]


def test_setting_or_unsetting_a_fixed_field_is_a_change():
    base = training()
    lr = _changed(base, "training.learningRate", 1e-6)
    assert _transition_refusals(lr, base) == _transition_refusals(base, lr) == ["spec.training.learningRate"]
    assert _transition_refusals(lr, lr) == []


def test_a_lora_adapter_is_kept_for_the_runs_life():
    """spec.training.lora set, unset, or another adapter (any of its settings) on a run that exists: refused, the
    message saying which; the same adapter written out with its defaults is no change."""
    full = training()
    adapter = _changed(full, "training.lora", {"r": 8})
    written_out = _changed(
        full, "training.lora", {"r": 8, "alpha": 32.0, "dropout": 0.05, "targetModules": ["all-linear"]}
    )
    got = {
        "set": admission_refusals(adapter, full),
        "unset": admission_refusals(full, adapter),
        "alpha": admission_refusals(_changed(adapter, "training.lora.alpha", 8.0), adapter),
        "targets": admission_refusals(_changed(adapter, "training.lora.targetModules", ["q_proj"]), adapter),
    }
    shown = {
        "set": "was full fine-tuning, now a LoRA adapter",
        "unset": "was a LoRA adapter, now full fine-tuning",
        "alpha": "another LoRA adapter",
        "targets": "another LoRA adapter",
    }
    for change, refusals in got.items():
        assert [(r.path, r.message) for r in refusals] == [("spec.training.lora", f"{FIXED}, got {shown[change]}")]
    assert admission_refusals(written_out, adapter) == admission_refusals(adapter, adapter) == []


def test_every_setting_the_resume_compares_is_fixed_at_admission():
    """The trainer's resume refuses a checkpoint whose identity settings (atlas_core/training/runner.py
    training_settings) differ: every spec change that changes them on a rendered run is refused on update."""
    from types import SimpleNamespace

    from atlas_operator.render import run_config

    from atlas_contract.run_config import RunConfig
    from atlas_core.training.runner import training_settings

    def identity(manifest: dict[str, Any]) -> dict[str, Any]:
        run = RunConfig.from_dict(run_config(parse_run(manifest)))
        return training_settings(run, SimpleNamespace(**run.trainer))

    compared = set()
    for example in EXAMPLES:
        for path, value in {**FIXED_CHANGES, **TAKEN_CHANGES}.items():
            changed = _changed(example, path, value)
            before, after = identity(example), identity(changed)
            if path == "backend":
                # Not fixed: the operator moves a run to another backend. A teacher's student server has another
                # URL there, and the identity records that URL (not the student model), so such a move is refused
                # by the resumed trainer today: an open problem of the backend move, not a field to fix.
                assert {k for k in before if before[k] != after[k]} <= {"student"}
                continue
            if after != before:
                compared.add(path)
                assert _transition_refusals(changed, example), path
    assert compared == set(FIXED_CHANGES)


# ------------------------------------------------------------------ what the API server checks of the rules


def _validations(schema: dict[str, Any]) -> list[dict[str, str]]:
    found, stack = [], [schema]
    while stack:
        node = stack.pop()
        found += node.get("x-kubernetes-validations") or []
        stack += list((node.get("properties") or {}).values()) + ([node["items"]] if "items" in node else [])
    return found


def _levels(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(level, schema) of every schema node that carries rules."""
    found = [(path, schema)] if schema.get("x-kubernetes-validations") else []
    for key, prop in (schema.get("properties") or {}).items():
        found += _levels(prop, f"{path}.{key}" if path else key)
    if "items" in schema:
        found += _levels(schema["items"], f"{path}[*]")
    return found


REFERENCE = re.compile(r"(has\()?\b(self|oldSelf)((?:\.[A-Za-z_]\w*)+)")
KUBERNETES_BOUNDED = {"metadata.name"}  # the API server's own bound (a DNS subdomain, 253)
# Read only against constants (startsWith, in, == a literal), which the API server prices by the constant: it accepts
# the CRDs (tests/kube/test_admission.py applies them to a real one).
READ_AGAINST_CONSTANTS = {"spec.evaluation.dataset.source", "spec.evaluation.dataset.split", "spec.env"}


def _resolve(schema: dict[str, Any], steps: list[str]) -> dict[str, Any] | None:
    for step in steps:
        schema = (schema.get("properties") or {}).get(step)
        if schema is None:
            return None
    return schema


def _unbounded(schema: dict[str, Any], where: str) -> list[str]:
    kind = schema.get("type")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return [f"{where}: unknown fields"]
    if kind == "string":
        return [] if "maxLength" in schema else [f"{where}: no maxLength"]
    if kind == "array":
        return ([] if "maxItems" in schema else [f"{where}: no maxItems"]) + _unbounded(schema["items"], f"{where}[*]")
    if kind == "object" and "additionalProperties" in schema:
        missing = [] if "maxProperties" in schema else [f"{where}: no maxProperties"]
        return missing + _unbounded(schema["additionalProperties"], f"{where}.*")
    if kind == "object":
        return [p for key, prop in schema["properties"].items() for p in _unbounded(prop, f"{where}.{key}")]
    return []


@pytest.mark.parametrize("kind", KINDS)
def test_every_rule_compiles_and_reads_declared_bounded_fields(kind):
    """What the API server checks when the CRD is applied: each rule compiles, names only fields of its schema
    (it type-checks them), a fieldPath names a field; and its cost is bounded: every string, list and map a rule
    reads has maxLength / maxItems / maxProperties (a has() test reads nothing), and rules on list items sit
    under a bounded list."""
    env = cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN})
    schema = crd_schema(kind)
    problems = []
    for level, node in _levels(schema):
        if "[*]" in level:
            lists = level.split("[*]")[:-1]
            problems += [f"{lst}: no maxItems" for lst in lists if "maxItems" not in _resolve(schema, lst.split("."))]
        for validation in node["x-kubernetes-validations"]:
            env.compile(validation["rule"])
            env.compile(validation["messageExpression"])
            if "fieldPath" in validation:
                assert _resolve(node, validation["fieldPath"].lstrip(".").split(".")) is not None, validation
            for match in REFERENCE.finditer(validation["rule"]):
                only_tested, path = match.group(1), match.group(3)
                steps = path.lstrip(".").split(".")
                if validation["rule"][match.end() : match.end() + 1] == "(":  # a method call: .matches(...)
                    steps.pop()
                name = ".".join(filter(None, [level, *steps]))
                read = _resolve(node, steps)
                if name in KUBERNETES_BOUNDED or name in READ_AGAINST_CONSTANTS:
                    continue
                if read is None:
                    problems.append(f"{name}: not in the schema ({validation['rule']})")
                elif not only_tested:
                    problems += _unbounded(read, name)
    assert problems == []


def test_bounds_are_enforced_and_documented():
    """A bound is the same for kubectl and the operator, and `kubectl explain` shows it."""
    spec = crd_schema("AtlasTraining")["properties"]["spec"]["properties"]
    assert spec["model"]["maxLength"] == 1024 and "Bound: at most 1024 characters." in spec["model"]["description"]
    assert spec["env"]["maxItems"] == 128
    with pytest.raises(InvalidFields) as invalid:
        parse_run(training(reward={"funcs": ["exact_match"] * 17}))
    assert "spec.reward.funcs: expected at most 16 items, got 17" in invalid.value.problems
    with pytest.raises(InvalidFields) as invalid:
        parse_run(training(queueName="q" * 64))
    assert "spec.queueName: expected at most 63 characters, got 64" in invalid.value.problems


def test_the_validation_page_lists_every_rule():
    """docs/validation.md, "Admission", names the field of every rule (the message's field, list items as `[*]`)."""
    text = (REPO / "docs" / "validation.md").read_text()
    section = re.search(r"^## Admission[^\n]*\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    for kind in KINDS:
        for rule in rules_for(kind):
            field = rule.field
            last = field.rsplit(".", 1)[-1]
            assert f"`{field}" in section or f"`{last}" in section, field


@pytest.mark.parametrize("kind", KINDS)
def test_the_crds_with_their_rules_are_valid_for_the_oldest_kubernetes_the_chart_takes(kind):
    """x-kubernetes-validations with fieldPath is a CustomResourceDefinition field from Kubernetes 1.29 (the
    chart's kubeVersion is >=1.29); strict: a misspelled key of a rule fails."""
    import kubernetes_validate

    (path,) = (p for p in (REPO / "crds").glob("*.yaml") if f"kind: {kind}\n" in p.read_text())
    kubernetes_validate.validate(yaml.safe_load(path.read_text()), "1.29.0", strict=True)


def test_what_cel_cannot_hold_never_stops_the_rules():
    """A YAML date in spec.training.extra (CEL sees no unknown field, as in the API server) and a number beyond
    64 bits (refused by the schema first, as Kubernetes stores none) leave every rule to run."""
    import datetime

    manifest = training(
        env=[{"name": "A", "value": "1", "valueFrom": {"when": datetime.date(2024, 1, 1)}}],
        training={"maxSteps": 10**30, "extra": {"when": datetime.date(2024, 1, 1)}},
    )
    with pytest.raises(InvalidFields) as invalid:
        parse_run(manifest)
    assert sorted(p.split(":")[0] for p in invalid.value.problems) == ["spec.env[0]", "spec.training.maxSteps"]


def test_the_operators_handler_threads_compile_the_rules_once():
    """Sixteen handler threads taking the first runs of a burst together: the rules are compiled once per kind, not
    once per thread (each compilation held the others back; see bench/operator_throughput.py)."""
    import threading

    from atlas_operator import cel_rules

    cel_rules.compile_kind.cache_clear()
    start = threading.Barrier(16)

    def first_run(index: int) -> None:
        start.wait()
        parse_run(training(f"burst-{index}"))

    threads = [threading.Thread(target=first_run, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cel_rules.compile_kind.cache_info().misses == 1  # AtlasTraining's, once
    cel_rules.compile_rules()  # what the operator's start-up does: every kind, each once
    assert cel_rules.compile_kind.cache_info().misses == 2
