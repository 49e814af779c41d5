"""The run's cross-field rules, each declared once as a CEL expression, enforced twice.

The CRD generator (:mod:`atlas_operator.crd`) writes every rule into the CRDs as an ``x-kubernetes-validations``
entry at its schema level, so ``kubectl apply`` refuses a bad run at once; the operator (``parse_run``) evaluates
the very same expressions with Google's CEL runtime (cel-expr-python), so its ``Invalid`` message is the API
server's. Kubernetes evaluates a rule with ``self`` bound to the object at the rule's level, after defaulting;
the operator binds ``self`` to the same level of the parsed spec (:func:`atlas_operator.schema.to_object`),
whose defaults are the CRD's.

What CEL cannot see stays in :func:`atlas_operator.validation.validate_run` (docs/validation.md lists it):
``spec.training.extra`` (preserve-unknown-fields are invisible to CEL: the generation batch of a run that sets extra
is checked there, of one that does not here) and cluster state (the PVC, the reward ConfigMap, the backend's CRD).
The bundled reward config names and the builtin datasets are the operator's, and so the CRDs' too: the CRDs are
generated from the same source. Where a rule needs a value the operator decides (``spec.backend`` unset: the
operator's default backend), the operator evaluates it with that value filled in, so it also catches what the API
server cannot know.

Every rule has a ``messageExpression`` naming the values found (and a static ``message``, Kubernetes' fallback), and
a ``fieldPath``: the API server's refusal is the cause ``{field, message: "Invalid value: <message>"}``, and the
operator evaluates the same messageExpression, so its problem is ``"<field>: <message>"`` word for word. Messages
format only integers and strings on the operator's side (cel-go and cel-expr-python format doubles alike in every
case tried, but a transition rule's message, which shows doubles, is the API server's alone).

Transition rules (``oldSelf``) refuse a change a running run cannot take: the fields a checkpoint fixes
(atlas_core/training/resume.py, ``IDENTITY_TRAINER_FIELDS``; atlas_core/training/runner.py,
``training_settings``). Only the API server sees the old object; the trainer's resume check is their second line.

Rules use only CEL's standard library (no Kubernetes extension library), so any conformant runtime agrees.
"""

from __future__ import annotations

import functools
import threading
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from atlas_contract import checks, datasets, defaults, sources, tracking
from atlas_contract.checks import REWARD_FUNCTIONS
from atlas_contract.lora import ALL_LINEAR, MAX_TARGET_MODULES
from atlas_contract.names import MAX_RUN_NAME, TRAINJOB_RESERVED_ENV, max_jobset_run_name, max_trainjob_run_name

# A rule reads the spec through these, so the defaults it assumes for an unset field are the spec types' own.
from atlas_operator.schema import camel
from atlas_operator.spec import (
    DNS_LABEL,
    SERVER_ONLY_ROLLOUT_FIELDS,
    PolicyRolloutSpec,
    ResourcesSpec,
    TrainingSpec,
)

BOTH = ("AtlasTraining", "AtlasTeacher")
ALGORITHM = "{algorithm}"  # in an expression: the run's algorithm (self.algorithm, or 'teacher' for AtlasTeacher)


@dataclass(frozen=True)
class Rule:
    """One rule. ``level``: where the CRD attaches it (``spec``, ``spec.rollout``, ``spec.env[*]`` for each item,
    ``""`` for the whole object); ``field``: the field it refuses, a full path under ``level`` (the CRD's
    ``fieldPath``, so the API server names it in the refusal's cause, as the operator does).

    The message is what was expected and what was found: ``expected`` is the static ``message`` (Kubernetes' text
    when the ``messageExpression`` cannot be evaluated), ``got`` a CEL expression of the values found, a string;
    the ``messageExpression`` is ``expected + ", got " + got``, or ``text`` (a CEL expression of the whole message)
    where a message reads better with the values inside it. The API server reports a refusal as the cause
    ``{field: <field>, message: "Invalid value: <message>"}``; the operator as ``"<field>: <message>"``."""

    level: str
    rule: str
    field: str
    expected: str
    got: str | None = None
    kinds: tuple[str, ...] = BOTH
    transition: bool = False
    text: str | None = None

    @property
    def message(self) -> str:
        return self.expected

    @property
    def field_path(self) -> str | None:
        """The CRD's ``fieldPath``: the field relative to ``level`` (none for the level itself)."""
        if self.field == self.level:
            return None
        return self.field.removeprefix(self.level) if self.level else "." + self.field

    def expression(self, kind: str) -> str:
        return _for_kind(self.rule, kind)

    def message_expression(self, kind: str) -> str:
        if self.text is not None:
            return _for_kind(self.text, kind)
        got = self.got if self.got is not None else _quote("the value found")
        return _for_kind(f"{_quote(self.expected + ', got ')} + {got}", kind)


def _for_kind(expression: str, kind: str) -> str:
    return expression.replace(ALGORITHM, "self.algorithm" if kind == "AtlasTraining" else "'teacher'")


def _quote(text: str) -> str:
    """``text`` as a CEL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quoted(expression: str) -> str:
    """A CEL expression of a string, in single quotes, for a message."""
    return f'"\'" + {expression} + "\'"'


DIGITS = "['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']"
NUM_DIGITS = 7


def num(expression: str, digits: int = NUM_DIGITS) -> str:
    """A CEL expression of a non-negative int as a string, for a message: its digits, each looked up in a list.
    ``string(int)`` would do, but the API server cannot bound the length of what it makes, so it prices a message
    that concatenates one beyond any budget (and refuses the CRD); a digit has a known length. Numbers of more than
    ``digits`` digits (``NUM_DIGITS`` unless the schema bounds it lower) show as a bound, a negative one fails the
    expression (the static message then)."""
    x = f"({expression})"
    parts = [f"({x} >= {10**i} ? {DIGITS}[{x} / {10**i} % 10] : '')" for i in range(digits - 1, 0, -1)]
    limit = 10**digits
    return f"({x} >= {limit} ? '{limit} or more' : " + " + ".join([*parts, f"{DIGITS}[{x} % 10]"]) + ")"


# ------------------------------------------------------------------ expressions over spec (self = spec)


def has(path: str, root: str = "self") -> str:
    """``path`` is set: every step of it tested, as CEL's has() takes one field at a time."""
    parts = path.split(".")
    return "(" + " && ".join(f"has({'.'.join([root, *parts[: i + 1]])})" for i in range(len(parts))) + ")"


def value(path: str, unset: Any, root: str = "self") -> str:
    """The field at ``path``, or ``unset`` when it (or an object above it) is not set."""
    return f"({has(path, root)} ? {root}.{path} : {_literal(unset)})"


def _literal(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _default(cls: type[DataclassInstance], name: str) -> Any:
    return cls.__dataclass_fields__[name].default


COLOCATE = f"({has('rollout.mode')} && self.rollout.mode == 'colocate')"
# spec.rollout.replicas as the run will use it (atlas_operator.spec.resolve_rollout): 0 colocated, else the set
# value, else 1 (0 for algorithm sft, which generates nothing).
ROLLOUT_REPLICAS = (
    f"({COLOCATE} ? 0 : {has('rollout.replicas')} ? self.rollout.replicas : {ALGORITHM} == 'sft' ? 0 : 1)"
)
ROLLOUT_TP = value("rollout.tensorParallelSize", _default(PolicyRolloutSpec, "tensor_parallel_size"))
GPUS_PER_NODE = value("resources.gpusPerNode", _default(ResourcesSpec, "gpus_per_node"))
# ResourcesSpec.processes(): processesPerNode, else one per GPU (one on CPU).
PROCESSES = (
    f"({has('resources.processesPerNode')} ? self.resources.processesPerNode : "
    f"{GPUS_PER_NODE} > 0 ? {GPUS_PER_NODE} : 1)"
)
JUDGES = f"({has('reward.config')} || {has('reward.configMapRef')})"
# The reward functions in effect (atlas_operator.spec.reward_funcs): the set list, else exact_match for an
# AtlasTraining grpo without judges, else none.
REWARD_FUNC_COUNT = f"({has('reward.funcs')} ? size(self.reward.funcs) : ({ALGORITHM} == 'grpo' && !{JUDGES}) ? 1 : 0)"
JOBSET = f"({has('backend')} && self.backend == 'JobSet')"
TRAINJOB = f"({has('backend')} && self.backend == 'TrainJob')"


# ------------------------------------------------------------------ the rules


def _rollout_rules() -> Iterator[Rule]:
    """Settings that belong to one rollout mode: a server's, or colocate's."""
    for name in SERVER_ONLY_ROLLOUT_FIELDS:
        field = camel(name)
        unset = f"!has(self.{field})" + (f" || size(self.{field}) == 0" if name == "args" else "")
        got = (
            f"{num('size(self.args)')} + ' arguments'"
            if name == "args"
            else num(f"self.{field}")
            if name in ("replicas", "gpus")
            else f'"\'" + self.{field} + "\'"'
        )
        yield Rule(
            "spec.rollout",
            f"!(has(self.mode) && self.mode == 'colocate') || {unset}",
            f"spec.rollout.{field}",
            "a rollout-server setting, and mode colocate runs vLLM inside the trainer processes, with no server; "
            "remove it",
            got,
        )
    yield Rule(
        "spec.rollout",
        "(has(self.mode) && self.mode == 'colocate') || !has(self.enableSleepMode)",
        "spec.rollout.enableSleepMode",
        "a colocate setting; set spec.rollout.mode colocate, or remove it",
        "(self.enableSleepMode ? 'true' : 'false') + ' with mode ' + (has(self.mode) ? self.mode : 'unset')",
    )
    yield Rule(
        "spec.rollout",
        "(has(self.mode) && self.mode == 'colocate') || !has(self.replicas) || self.replicas <= 1",
        "spec.rollout.replicas",
        "expected 0 or 1 (the trainer syncs weights into one rollout server; scale it with "
        "spec.rollout.tensorParallelSize)",
        num("self.replicas"),
    )


def _rollout_placement_rules() -> Iterator[Rule]:
    """Where generation runs (a server, the trainer's GPUs, or the trainer on CPU), seen from the whole spec."""
    yield Rule(
        "spec",
        f"!({has('rollout.mode')} && self.rollout.mode == 'server') || {ROLLOUT_REPLICAS} >= 1",
        "spec.rollout.replicas",
        "expected at least 1 with mode server",
        num(ROLLOUT_REPLICAS),
    )
    yield Rule(
        "spec",
        f"{ROLLOUT_REPLICAS} == 0 || !{has('rollout.gpus')} || self.rollout.gpus == {ROLLOUT_TP}",
        "spec.rollout.gpus",
        "expected spec.rollout.tensorParallelSize (unset, it is): GPUs requested = GPUs used, a server uses "
        f"tensorParallelSize x data-parallel GPUs and runs one data-parallel rank ({checks.DATA_PARALLEL_REASON}); "
        "to use more GPUs, raise spec.rollout.tensorParallelSize",
        text=f"{num('self.rollout.gpus')} + ' is not spec.rollout.tensorParallelSize (' + {num(ROLLOUT_TP)} + "
        + _quote(
            "): GPUs requested = GPUs used, a server uses tensorParallelSize x data-parallel GPUs and runs one "
            f"data-parallel rank ({checks.DATA_PARALLEL_REASON}); to use more GPUs, raise "
            "spec.rollout.tensorParallelSize"
        ),
    )
    yield Rule(
        "spec",
        f"!{COLOCATE} || {GPUS_PER_NODE} != 0",
        "spec.rollout.mode",
        "colocate runs vLLM on the trainer's GPUs, and spec.resources.gpusPerNode is 0 (on CPU leave mode unset "
        "and set spec.rollout.replicas: 0: the trainer generates)",
        "'colocate with gpusPerNode 0'",
    )
    yield Rule(
        "spec",
        f"!{COLOCATE} || {GPUS_PER_NODE} == 0 || {PROCESSES} % {ROLLOUT_TP} == 0",
        "spec.rollout.tensorParallelSize",
        "colocated vLLM shards the model over a node's trainer processes; expected a divisor of "
        "spec.resources.processesPerNode (default: gpusPerNode)",
        f"{num(ROLLOUT_TP)} + ' with ' + {num(PROCESSES)} + ' processes per node'",
    )
    yield Rule(
        "spec",
        f"!({COLOCATE} && {ALGORITHM} == 'sft')",
        "spec.rollout.mode",
        "algorithm sft generates nothing; remove mode colocate",
        "'colocate'",
        kinds=("AtlasTraining",),
    )
    yield Rule(
        "spec",
        f"{ALGORITHM} != 'sft' || {COLOCATE} || !{has('rollout.replicas')} || self.rollout.replicas == 0",
        "spec.rollout.replicas",
        "expected 0 for algorithm sft (SFT generates nothing)",
        num("self.rollout.replicas"),
        kinds=("AtlasTraining",),
    )


def _student_rules() -> Iterator[Rule]:
    yield Rule(
        "spec.student.rollout",
        "self.replicas == 0 || !has(self.gpus) || self.gpus == self.tensorParallelSize",
        "spec.student.rollout.gpus",
        "expected spec.student.rollout.tensorParallelSize (unset, it is): GPUs requested = GPUs used, a server uses "
        f"tensorParallelSize x data-parallel GPUs and runs one data-parallel rank ({checks.DATA_PARALLEL_REASON}); "
        "to use more GPUs, raise spec.student.rollout.tensorParallelSize or spec.student.rollout.replicas "
        "(PyTorchJob backend)",
        kinds=("AtlasTeacher",),
        text=f"{num('self.gpus')} + ' is not spec.student.rollout.tensorParallelSize (' + "
        f"{num('self.tensorParallelSize')} + "
        + _quote(
            "): GPUs requested = GPUs used, a server uses tensorParallelSize x data-parallel GPUs and runs one "
            f"data-parallel rank ({checks.DATA_PARALLEL_REASON}); to use more GPUs, raise "
            "spec.student.rollout.tensorParallelSize or spec.student.rollout.replicas (PyTorchJob backend)"
        ),
    )
    yield Rule(
        "spec",
        f"!{JOBSET} || !{has('student.rollout.replicas')} || self.student.rollout.replicas <= 1",
        "spec.student.rollout.replicas",
        "expected 0 or 1 with the JobSet backend (the trainer reaches the student server by its pod's stable "
        "hostname, so more replicas would hold GPUs and serve nothing)",
        num("self.student.rollout.replicas"),
        kinds=("AtlasTeacher",),
    )


# max_jobset_run_name(nodes) (atlas_contract.names) is this less the digits of the last node's index, nodes - 1.
JOBSET_NAME_AND_INDEX = max_jobset_run_name(1) + len("0")
NAME = "self.metadata.name"


def _name_got(nodes: str, name_and_index: int) -> str:
    """A name's length, the run's nodes and the longest name they allow."""
    return (
        f"{num(f'size({NAME})')} + ' characters with ' + {num(nodes)} + ' nodes (at most ' + "
        f"{num(f'{name_and_index} - size(string({nodes} - 1))')} + ')'"
    )


def _name_rules() -> Iterator[Rule]:
    yield Rule(
        "",
        f"{NAME}.matches('^{DNS_LABEL}$') && size({NAME}) <= {MAX_RUN_NAME}",
        "metadata.name",
        f"expected a DNS label of at most {MAX_RUN_NAME} characters (lowercase letters, digits, '-', starting "
        "with a letter)",
        f"\"'\" + {NAME} + \"' (\" + {num(f'size({NAME})')} + ' characters)'",
    )
    nodes = value("resources.nodes", _default(ResourcesSpec, "nodes"), root="self.spec")
    yield Rule(
        "",
        f"!(has(self.spec.backend) && self.spec.backend == 'JobSet') || "
        f"size({NAME}) + size(string({nodes} - 1)) <= {JOBSET_NAME_AND_INDEX}",
        "metadata.name",
        f"too long for the JobSet backend: its trainer pods are named <name>-trainer-0-<node>-<5 random>, a DNS "
        f"label of 63 characters (at most {max_jobset_run_name(10)} characters up to 10 nodes)",
        _name_got(nodes, JOBSET_NAME_AND_INDEX),
    )


# max_trainjob_run_name(nodes) (atlas_contract.names) is this less the digits of the last node's index, nodes - 1.
TRAINJOB_NAME_AND_INDEX = max_trainjob_run_name(1) + len("0")


def _trainjob_rules() -> Iterator[Rule]:
    """What the Kubeflow Trainer (v2.3.0) decides on a TrainJob, refused at apply rather than by its webhook later."""
    nodes = value("resources.nodes", _default(ResourcesSpec, "nodes"), root="self.spec")
    yield Rule(
        "",
        "!(has(self.spec.backend) && self.spec.backend == 'TrainJob') || "
        f"size({NAME}) + size(string({nodes} - 1)) <= {TRAINJOB_NAME_AND_INDEX}",
        "metadata.name",
        "too long for the TrainJob backend: its trainer pods are named <name>-node-0-<node>-<5 random>, a DNS "
        f"label of 63 characters (at most {max_trainjob_run_name(10)} characters up to 10 nodes)",
        _name_got(nodes, TRAINJOB_NAME_AND_INDEX),
    )
    yield Rule(
        "spec",
        f"!{TRAINJOB} || !{has('automountServiceAccountToken')} || !self.automountServiceAccountToken",
        "spec.automountServiceAccountToken",
        "expected false with the TrainJob backend: its runtime's pods never mount an API token (a TrainJob "
        "cannot set it for its pods)",
        "'true'",
    )
    # Each reserved name tested on its own: the message lists the ones set, and CEL's standard library has no join.
    reserved = " + ".join(
        f"(self.env.exists(e, e.name == '{name}') ? ' {name}' : '')" for name in TRAINJOB_RESERVED_ENV
    )
    yield Rule(
        "spec",
        f"!{TRAINJOB} || !has(self.env) || !self.env.exists(e, e.name in {_list(TRAINJOB_RESERVED_ENV)})",
        "spec.env",
        f"the Kubeflow Trainer sets {', '.join(TRAINJOB_RESERVED_ENV)} on backend TrainJob (its webhook refuses "
        "a TrainJob whose trainer sets one); remove them",
        f"'names' + {reserved}",
    )


def _list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _reward_rules() -> Iterator[Rule]:
    yield Rule(
        "spec.reward",
        "!(has(self.config) && has(self.configMapRef))",
        "spec.reward",
        "set config or configMapRef, not both",
        '"config \'" + self.config + "\' and configMapRef \'" + self.configMapRef.name + "\'"',
    )
    configs = checks.bundled_reward_configs()  # the operator's files: the CRDs are generated with them
    yield Rule(
        "spec.reward",
        f"!has(self.config) || self.config in {_list(configs)}",
        "spec.reward.config",
        f"expected one of {', '.join(configs)} (or use configMapRef for your own)",
        '"\'" + self.config + "\'"',
    )
    unknown = f"self.funcs.filter(f, !(f in {_list(REWARD_FUNCTIONS)}))"
    yield Rule(
        "spec.reward",
        f"!has(self.funcs) || self.funcs.all(f, f in {_list(REWARD_FUNCTIONS)})",
        "spec.reward.funcs",
        f"expected known reward functions ({', '.join(REWARD_FUNCTIONS)})",
        f"\"'\" + {unknown}[0] + \"'\" + (size({unknown}) > 1 ? ' and ' + {num(f'size({unknown}) - 1')} + "
        "' more' : '')",
    )
    yield Rule(
        "spec",
        f"!{has('reward.weights')} || size(self.reward.weights) == {REWARD_FUNC_COUNT} + ({JUDGES} ? 1 : 0)",
        "spec.reward.weights",
        "expected one weight per reward function (spec.reward.funcs; exact_match when unset on an AtlasTraining "
        "grpo without judges), then one for the RIM judges",
        f"{num('size(self.reward.weights)')} + ' weights for ' + {num(REWARD_FUNC_COUNT)} + "
        f"' reward functions' + ({JUDGES} ? ' and RIM judges' : ' and no judges')",
    )
    yield Rule(
        "spec",
        f"{ALGORITHM} != 'grpo' || {REWARD_FUNC_COUNT} > 0 || {JUDGES}",
        "spec.reward",
        "expected at least one reward function (funcs) or RIM judges (config)",
        "'funcs [] and no judges'",
        kinds=("AtlasTraining",),
    )


# TRL's generation batch (atlas_contract.checks.generation_batch_problem) over the typed fields, with their defaults.
_GRPO = defaults.training_defaults("grpo")
NUM_GENERATIONS = value("training.numGenerations", _GRPO["num_generations"])
PER_DEVICE_BATCH = value("training.perDeviceTrainBatchSize", _GRPO["per_device_train_batch_size"])
ACCUMULATION = value("training.gradientAccumulationSteps", _GRPO["gradient_accumulation_steps"])
ALL_PROCESSES = f"({value('resources.nodes', _default(ResourcesSpec, 'nodes'))} * {PROCESSES})"
GENERATION_BATCH = f"({PER_DEVICE_BATCH} * {ALL_PROCESSES} * {ACCUMULATION})"


def _training_rules() -> Iterator[Rule]:
    yield Rule(
        "spec.resources",
        "!has(self.processesPerNode) || self.gpusPerNode == 0 || self.processesPerNode <= self.gpusPerNode",
        "spec.resources.processesPerNode",
        "expected at most gpusPerNode processes (one per GPU)",
        f"{num('self.processesPerNode')} + ' with gpusPerNode ' + {num('self.gpusPerNode')}",
    )
    # spec.training.extra's steps_per_generation and generation_batch_size enter the batch, and CEL cannot read
    # extra: a run that sets extra is checked by the operator only (validation.validate_run).
    yield Rule(
        "spec",
        f"{ALGORITHM} == 'sft' || {has('training.extra')} || {NUM_GENERATIONS} < 2 || "
        f"{GENERATION_BATCH} % {NUM_GENERATIONS} == 0",
        "spec.training.numGenerations",
        "expected a divisor of the generation batch (perDeviceTrainBatchSize x processes x "
        "gradientAccumulationSteps completions: TRL's generation batch holds whole groups)",
        text=f"{num(NUM_GENERATIONS)} + ' does not divide the generation batch of ' + {num(GENERATION_BATCH)} + "
        f"' completions (perDeviceTrainBatchSize ' + {num(PER_DEVICE_BATCH)} + ' x ' + {num(ALL_PROCESSES)} + "
        f"' processes x gradientAccumulationSteps ' + {num(ACCUMULATION)} + ')'",
    )
    for name in defaults.GRPO_ONLY:
        yield Rule(
            "spec",
            f"{ALGORITHM} != 'sft' || !{has('training.' + camel(name))}",
            f"spec.training.{camel(name)}",
            "a GRPO setting; algorithm sft does not use it (remove it)",
            _shown(f"self.training.{camel(name)}", TRAINING_TYPES[name]),
            kinds=("AtlasTraining",),
        )
    yield Rule(
        "spec.env[*]",
        "!(has(self.value) && has(self.valueFrom))",
        "spec.env[*]",
        "set value or valueFrom, not both",
        "'both for ' + self.name",
    )


def _dataset_rules() -> Iterator[Rule]:
    """The builtin datasets (atlas_contract.datasets.BUILTINS): known, trained on by the run's algorithm, with the
    split asked for; the same checks and words as datasets.dataset_problems / evaluation_problems."""
    builtins = datasets.BUILTINS
    known, scheme = _list(list(builtins)), datasets.BUILTIN_SCHEME
    available = f" (available: {', '.join(builtins)})"

    def chain(source: str, each: dict[str, str], otherwise: str) -> str:
        """``each[builtin]`` for the builtin ``source`` is, else ``otherwise``."""
        found = otherwise
        for name, expression in reversed(each.items()):
            found = f"({source} == '{name}' ? {expression} : {found})"
        return found

    source, split = "self.dataset.source", value("dataset.split", "train")
    allowed = chain(source, {n: f"{ALGORITHM} in {_list(b.algorithms)}" for n, b in builtins.items()}, "true")
    splits = {n: f"({ALGORITHM} == 'sft' ? {_list(b.sft_splits)} : {_list(b.splits)})" for n, b in builtins.items()}
    split_ok = chain(source, {n: f"{split} in {s}" for n, s in splits.items()}, "true")
    named = datasets.splits_text
    split_names = {
        n: f"({ALGORITHM} == 'sft' ? '{named(b.sft_splits)}' : '{named(b.splits)}')" for n, b in builtins.items()
    }
    training_splits = chain(source, split_names, "''")
    is_known = f"{has('dataset.source')} && {source} in {known}"
    training_ok = (
        f"(!{has('dataset.source')} || !{source}.startsWith('{scheme}') || ({source} in {known} && "
        f"{allowed} && {split_ok}))"
    )
    yield Rule(
        "spec",
        f"!{has('dataset.source')} || !{source}.startsWith('{scheme}') || {source} in {known}",
        "spec.dataset.source",
        f"unknown builtin{available}",
        text=f'"unknown builtin \'" + {source} + {_quote(chr(39) + available)}',
    )
    yield Rule(
        "spec",
        f"!({is_known}) || {allowed}",
        "spec.dataset.source",
        "an SFT dataset (use algorithm sft)",
        text=f'"\'" + {source} + "\' is an SFT dataset (use algorithm sft)"',
    )
    yield Rule(
        "spec",
        f"!({is_known} && {allowed}) || {split_ok}",
        "spec.dataset.split",
        "a split the builtin has for the run's algorithm",
        text=f"{quoted(source)} + ' has ' + {training_splits} + ' for algorithm ' + {ALGORITHM} + "
        f"', got ' + {quoted(split)}",
    )
    # The evaluation's dataset (AtlasTeacher): an unset source is the training one, named once (above) when wrong.
    evaluated = f"({has('evaluation.dataset.source')} ? self.evaluation.dataset.source : {source})"
    checked = f"({has('evaluation')} && ({has('evaluation.dataset.source')} || {training_ok}))"
    eval_split = value("evaluation.dataset.split", defaults.EVALUATION["split"])
    evaluable = [n for n, b in builtins.items() if b.evaluable]
    yield Rule(
        "spec",
        f"!{checked} || !{evaluated}.startsWith('{scheme}') || {evaluated} in {known}",
        "spec.evaluation.dataset.source",
        f"unknown builtin{available}",
        kinds=("AtlasTeacher",),
        text=f'"unknown builtin \'" + {evaluated} + {_quote(chr(39) + available)}',
    )
    yield Rule(
        "spec",
        f"!({checked} && {evaluated} in {known}) || {evaluated} in {_list(evaluable)}",
        "spec.evaluation.dataset.source",
        f"an SFT dataset (demonstrations, no problems to answer); expected a dataset of problems "
        f"({', '.join(evaluable)}, a file, hf://…)",
        kinds=("AtlasTeacher",),
        text=f'"\'" + {evaluated} + '
        + _quote(
            "' is an SFT dataset (demonstrations, no problems to answer); expected a dataset of problems "
            f"({', '.join(evaluable)}, a file, hf://…)"
        ),
    )
    eval_split_ok = chain(evaluated, {n: f"{eval_split} in {_list(builtins[n].splits)}" for n in evaluable}, "true")
    eval_names = {n: f"'{named(builtins[n].splits)}'" for n in evaluable}
    evaluation_splits = chain(evaluated, eval_names, "''")
    yield Rule(
        "spec",
        f"!({checked} && {evaluated} in {_list(evaluable)}) || {eval_split_ok}",
        "spec.evaluation.dataset.split",
        "a split the builtin has",
        kinds=("AtlasTeacher",),
        text=f"{quoted(evaluated)} + ' has ' + {evaluation_splits} + ', got ' + {quoted(eval_split)}",
    )


# The URI fields (atlas_contract/sources.py) and the kinds that have them.
URI_FIELDS = {
    "model": BOTH,
    "student.model": ("AtlasTeacher",),
    "dataset.source": BOTH,
    "evaluation.dataset.source": ("AtlasTeacher",),
    "output.uri": BOTH,
}
OUTPUT_SCHEMES = (sources.S3_SCHEME, sources.PVC_SCHEME, sources.HUB_SCHEME)


def _source_rules() -> Iterator[Rule]:
    """A URI that cannot be valid: an ``s3://`` without a bucket, a ``pvc://`` without a claim, an ``hf://`` without
    a repository (atlas_contract.sources.uri_problems says the same words); an output that is none of the three."""
    patterns = {
        sources.S3_SCHEME: f"^s3://{sources.S3_BUCKET_PATTERN}(/.*)?$",
        sources.PVC_SCHEME: f"^pvc://{sources.PVC_CLAIM_PATTERN}(/.*)?$",
        sources.HUB_SCHEME: f"^hf://{sources.HUB_REPO_PATTERN}$",
    }
    for path, kinds in URI_FIELDS.items():
        field = f"self.{path}"
        for scheme, pattern in patterns.items():
            expected = f"expected {sources.EXPECTED[scheme]}"
            yield Rule(
                "spec",
                f"!{has(path)} || !{field}.startsWith('{scheme}') || {field}.matches('{pattern}')",
                f"spec.{path}",
                f"not a valid URI ({expected})",
                kinds=kinds,
                text=f"{quoted(field)} + {_quote(f' is not a valid URI ({expected})')}",
            )
    schemes = " || ".join(f"self.output.uri.startsWith('{scheme}')" for scheme in OUTPUT_SCHEMES)
    expected = f"expected {', '.join(f'{scheme}…' for scheme in OUTPUT_SCHEMES)}"
    yield Rule(
        "spec",
        f"!{has('output.uri')} || {schemes}",
        "spec.output.uri",
        f"not an export destination ({expected})",
        text=f"{quoted('self.output.uri')} + {_quote(f' is not an export destination ({expected})')}",
    )


def _tracking_rules() -> Iterator[Rule]:
    """spec.tracking.mlflow.uri: a tracking server or store MLflow can reach (atlas_contract/tracking.py)."""
    yield Rule(
        "spec",
        f"!{has('tracking.mlflow.uri')} || self.tracking.mlflow.uri.matches('{tracking.MLFLOW_URI_PATTERN}')",
        "spec.tracking.mlflow.uri",
        f"expected {tracking.MLFLOW_URI_EXPECTED}",
        quoted("self.tracking.mlflow.uri"),
    )


def _lora_rules() -> Iterator[Rule]:
    """spec.training.lora.targetModules as the contract takes it (atlas_contract/lora.py): [all-linear] alone, or
    module names; its size is the schema's bound, and r, alpha and dropout the schema's ranges."""
    level, field, names = "spec.training.lora", "spec.training.lora.targetModules", "self.targetModules"
    yield Rule(
        level,
        f"!has({names}) || size({names}) > 0",
        field,
        f"expected [{ALL_LINEAR}] or at least one module name",
        "'[]'",
    )
    blank = f"{names}.filter(m, !m.matches('[^[:space:]]'))"
    yield Rule(
        level,
        f"!has({names}) || size({blank}) == 0",
        field,
        "expected module names, none blank",
        quoted(f"{blank}[0]"),
    )
    others = f"{names}.filter(m, m != '{ALL_LINEAR}')"
    yield Rule(
        level,
        f"!has({names}) || !('{ALL_LINEAR}' in {names}) || size({names}) == 1",
        field,
        f"'{ALL_LINEAR}' stands alone (it already names every linear layer but the output head)",
        f"\"'{ALL_LINEAR}' with \" + (size({others}) == 0 ? \"'{ALL_LINEAR}' again\" : {quoted(f'{others}[0]')} + "
        f"(size({others}) > 1 ? ' and ' + {num(f'size({others}) - 1', len(str(MAX_TARGET_MODULES)))} + ' more' : ''))",
    )


# The spec fields a checkpoint fixes (see the module's docstring): a change would be silently half-applied. LoRA or
# not, and the adapter's shape: a LoRA run's checkpoints hold its adapter and no full weights (a full run's no adapter).
CHECKPOINT_FIXED = (
    "model",
    "dataset",
    "reward",
    *(f"training.{camel(name)}" for name in ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay")),
    "training.seed",
    "training.lora",
)


def _shown(expression: str, kind: type) -> str:
    """A field's value for a message: a number by its digits, a string in quotes; a double not at all (the API
    server cannot bound the length of string(double), see num), only that it is set."""
    if kind is int:
        return num(expression)
    if kind is str:
        return quoted(expression)
    return "'a value'"


# The types of the fields whose values messages show.
TRAINING_TYPES = {
    name: next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    for name, hint in typing.get_type_hints(TrainingSpec).items()
}
FIXED_TYPES = {
    "model": str,
    "student.model": str,
    "algorithm": str,
    **{
        f"training.{camel(name)}": TRAINING_TYPES[name]
        for name in ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "seed")
    },
}


def _unchanged(path: str) -> str:
    now, before = has(path), has(path, root="oldSelf")
    return f"{now} == {before} && (!{now} || self.{path} == oldSelf.{path})"


FIXED = "fixed by the run's checkpoints (the trainer would refuse to resume them); create a new run to change it"


def _change(path: str) -> str:
    """The old and the new value of ``path`` (a scalar; a dataset by its source and split), for a message."""

    def shown(root: str) -> str:
        if path == "dataset":
            split = value("dataset.split", "train", root)
            return f"({has('dataset.source', root)} ? {root}.dataset.source + ' split ' + {split} : 'unset')"
        return f"({has(path, root)} ? {_shown(f'{root}.{path}', FIXED_TYPES[path])} : 'unset')"

    if path == "reward":  # an object of lists: no CEL standard function shows it
        return "'another reward'"
    if path == "training.lora":  # an object: whether there is an adapter, or that it is another one

        def trained(root: str) -> str:
            return f"({has(path, root)} ? 'a LoRA adapter' : 'full fine-tuning')"

        both = f"{has(path)} && {has(path, 'oldSelf')}"
        return f"({both} ? 'another LoRA adapter' : 'was ' + {trained('oldSelf')} + ', now ' + {trained('self')})"
    return f"'was ' + {shown('oldSelf')} + ', now ' + {shown('self')}"


def _transition_rules() -> Iterator[Rule]:
    for path in CHECKPOINT_FIXED:
        yield Rule("spec", _unchanged(path), f"spec.{path}", FIXED, _change(path), transition=True)
    for path, kind in (("algorithm", "AtlasTraining"), ("student.model", "AtlasTeacher")):
        yield Rule("spec", _unchanged(path), f"spec.{path}", FIXED, _change(path), kinds=(kind,), transition=True)


RULES: tuple[Rule, ...] = tuple(
    rule
    for group in (
        _name_rules,
        _trainjob_rules,
        _rollout_rules,
        _rollout_placement_rules,
        _student_rules,
        _reward_rules,
        _training_rules,
        _dataset_rules,
        _source_rules,
        _lora_rules,
        _tracking_rules,
        _transition_rules,
    )
    for rule in group()
)


def rules_for(kind: str) -> list[Rule]:
    return [rule for rule in RULES if kind in rule.kinds]


def crd_validations(kind: str) -> dict[str, list[dict[str, str]]]:
    """Schema level → its ``x-kubernetes-validations``, as the CRD carries them."""
    by_level: dict[str, list[dict[str, str]]] = {}
    for rule in rules_for(kind):
        entry = {
            "rule": rule.expression(kind),
            "message": rule.message,
            "messageExpression": rule.message_expression(kind),
        }
        if rule.field_path:
            entry["fieldPath"] = rule.field_path
        by_level.setdefault(rule.level, []).append(entry)
    return by_level


# ------------------------------------------------------------------ the operator's enforcement


_compiling = threading.Lock()


def _compiled(kind: str) -> tuple[tuple[Rule, Any, Any], ...]:
    # One compilation per kind, under a lock: the operator's handler threads all validate their first runs at once,
    # and each compiling the rules itself (25 ms with the runtime's imports) stalled a burst of new runs.
    with _compiling:
        return compile_kind(kind)


@functools.cache
def compile_kind(kind: str) -> tuple[tuple[Rule, Any, Any], ...]:
    """``kind``'s rules compiled, each with its message expression (once: cached; call it through _compiled)."""
    from cel_expr_python import cel  # here: writing the CRDs (python -m atlas_operator.generate) needs no runtime

    env = cel.NewEnv(variables={"self": cel.Type.DYN})
    return tuple(
        (rule, env.compile(rule.expression(kind)), env.compile(rule.message_expression(kind)))
        for rule in rules_for(kind)
        if not rule.transition
    )


def compile_rules() -> None:
    """Compile every kind's rules now (the operator's start-up), not in the first reconciliations."""
    for kind in sorted({kind for rule in RULES for kind in rule.kinds}):
        _compiled(kind)


def problems(kind: str, name: str, spec: dict[str, Any]) -> list[str]:
    """Every rule ``spec`` (a parsed spec as the API server stores it) and ``name`` break, as
    ``"<field>: <message>"`` (the item's index in the field for a rule on list items): the API server's cause of
    the refusal, its field and its message less Kubernetes' ``Invalid value: ``."""
    obj = {"metadata": {"name": name}, "spec": spec}
    found = []
    for rule, program, message in _compiled(kind):
        for where, node in _nodes(obj, rule.level):
            result = program.eval(data={"self": node}).value()
            if result is not True:
                field = where + rule.field.removeprefix(rule.level) if rule.level else rule.field
                text = _message(message, node, rule) if result is False else f"cannot be checked ({result})"
                found.append(f"{field}: {text}")
    return found


def _message(program: Any, node: Any, rule: Rule) -> str:
    """The messageExpression's value, or the static message where Kubernetes uses it: the expression fails, or
    its value is not a string, is blank or has a line break."""
    try:
        text = program.eval(data={"self": node}).value()
    except Exception:  # noqa: BLE001 - the API server falls back to the message, so does the operator
        return rule.message
    if not isinstance(text, str) or not text.strip() or "\n" in text:
        return rule.message
    return text


def _nodes(obj: Any, level: str) -> Iterator[tuple[str, Any]]:
    """The values at ``level`` (``a.b``, ``a.list[*]``) with their concrete paths; none where a step is unset."""
    found = [("", obj)]
    for step in level.split(".") if level else []:
        name, each = step.removesuffix("[*]"), step.endswith("[*]")
        deeper = []
        for where, node in found:
            if not isinstance(node, dict) or node.get(name) is None:
                continue
            path = f"{where}.{name}" if where else name
            if each:
                deeper += [(f"{path}[{i}]", item) for i, item in enumerate(node[name])]
            else:
                deeper.append((path, node[name]))
        found = deeper
    return iter(found)
