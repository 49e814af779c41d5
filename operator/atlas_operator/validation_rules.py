"""The run's cross-field rules, each declared once as a CEL expression, enforced twice.

The CRD generator (:mod:`atlas_operator.crd`) writes every rule into the CRDs as an ``x-kubernetes-validations``
entry at its schema level, so ``kubectl apply`` refuses a bad run at once; the operator (``parse_run``) evaluates
the very same expressions with Google's CEL runtime (cel-expr-python), so its ``Invalid`` message is the API
server's. Kubernetes evaluates a rule with ``self`` bound to the object at the rule's level, after defaulting;
the operator binds ``self`` to the same level of the parsed spec (:func:`atlas_operator.schema.to_object`),
whose defaults are the CRD's.

What CEL cannot see stays in :func:`atlas_operator.validation.validate_run` (and the README lists it, "Validation"):
``spec.training.extra`` (preserve-unknown-fields are invisible to CEL), the bundled reward config names (the
operator's files), and cluster state (the PVC, the reward ConfigMap, the backend's CRD). Where a rule needs a
value the operator decides (``spec.backend`` unset: the operator's default backend), the operator evaluates it
with that value filled in, so it also catches what the API server cannot know.

Transition rules (``oldSelf``) refuse a change a running run cannot take: the fields a checkpoint fixes
(atlas_core/training/resume.py, ``IDENTITY_TRAINER_FIELDS``; atlas_core/training/runner.py,
``training_settings``). Only the API server sees the old object; the trainer's resume check is their second line.

Rules use only CEL's standard library (no Kubernetes extension library), so any conformant runtime agrees.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from atlas_contract import defaults, rules
from atlas_contract.names import MAX_RUN_NAME, max_jobset_run_name, max_trainjob_run_name
from atlas_contract.rules import REWARD_FUNCTIONS

# A rule reads the spec through these, so the defaults it assumes for an unset field are the spec types' own.
from atlas_operator.schema import camel
from atlas_operator.spec import (
    DNS_LABEL,
    SERVER_ONLY_ROLLOUT_FIELDS,
    PolicyRolloutSpec,
    ResourcesSpec,
)

BOTH = ("AtlasTraining", "AtlasTeacher")
ALGORITHM = "{algorithm}"  # in an expression: the run's algorithm (self.algorithm, or 'teacher' for AtlasTeacher)


@dataclass(frozen=True)
class Rule:
    """One rule. ``level``: where the CRD attaches it (``spec``, ``spec.rollout``, ``spec.env[*]`` for each item,
    ``""`` for the whole object); ``field``: the field its message names, a full path under ``level``;
    ``expected``: what that field must be. The message is ``"<field>: <expected>"`` on both sides."""

    level: str
    rule: str
    field: str
    expected: str
    kinds: tuple[str, ...] = BOTH
    transition: bool = False

    @property
    def message(self) -> str:
        return f"{self.field}: {self.expected}"

    @property
    def field_path(self) -> str | None:
        """The CRD's ``fieldPath``: the field relative to ``level`` (none for the level itself or for metadata,
        which the CRD's schema does not describe)."""
        if not self.level or self.field == self.level:
            return None
        return self.field.removeprefix(self.level)

    def expression(self, kind: str) -> str:
        return self.rule.replace(ALGORITHM, "self.algorithm" if kind == "AtlasTraining" else "'teacher'")


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


def _default(cls: type, name: str) -> Any:
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
        yield Rule(
            "spec.rollout",
            f"!(has(self.mode) && self.mode == 'colocate') || {unset}",
            f"spec.rollout.{field}",
            "a rollout-server setting, and mode colocate runs vLLM inside the trainer processes, with no server; "
            "remove it",
        )
    yield Rule(
        "spec.rollout",
        "(has(self.mode) && self.mode == 'colocate') || !has(self.enableSleepMode)",
        "spec.rollout.enableSleepMode",
        "a colocate setting; set spec.rollout.mode colocate, or remove it",
    )
    yield Rule(
        "spec.rollout",
        "(has(self.mode) && self.mode == 'colocate') || !has(self.replicas) || self.replicas <= 1",
        "spec.rollout.replicas",
        "expected 0 or 1 (the trainer syncs weights into one rollout server; scale it with "
        "spec.rollout.tensorParallelSize)",
    )


def _rollout_placement_rules() -> Iterator[Rule]:
    """Where generation runs (a server, the trainer's GPUs, or the trainer on CPU), seen from the whole spec."""
    yield Rule(
        "spec",
        f"!({has('rollout.mode')} && self.rollout.mode == 'server') || {ROLLOUT_REPLICAS} >= 1",
        "spec.rollout.replicas",
        "expected at least 1 with mode server",
    )
    yield Rule(
        "spec",
        f"{ROLLOUT_REPLICAS} == 0 || !{has('rollout.gpus')} || self.rollout.gpus == {ROLLOUT_TP}",
        "spec.rollout.gpus",
        "expected spec.rollout.tensorParallelSize (unset, it is): GPUs requested = GPUs used, a server uses "
        f"tensorParallelSize x data-parallel GPUs and runs one data-parallel rank ({rules.DATA_PARALLEL_REASON}); "
        "to use more GPUs, raise spec.rollout.tensorParallelSize",
    )
    yield Rule(
        "spec",
        f"!{COLOCATE} || {GPUS_PER_NODE} != 0",
        "spec.rollout.mode",
        "colocate runs vLLM on the trainer's GPUs, and spec.resources.gpusPerNode is 0 (on CPU leave mode unset "
        "and set spec.rollout.replicas: 0: the trainer generates)",
    )
    yield Rule(
        "spec",
        f"!{COLOCATE} || {GPUS_PER_NODE} == 0 || {PROCESSES} % {ROLLOUT_TP} == 0",
        "spec.rollout.tensorParallelSize",
        "colocated vLLM shards the model over a node's trainer processes; expected a divisor of "
        "spec.resources.processesPerNode (default: gpusPerNode)",
    )
    yield Rule(
        "spec",
        f"!({COLOCATE} && {ALGORITHM} == 'sft')",
        "spec.rollout.mode",
        "algorithm sft generates nothing; remove mode colocate",
        kinds=("AtlasTraining",),
    )
    yield Rule(
        "spec",
        f"{ALGORITHM} != 'sft' || {COLOCATE} || !{has('rollout.replicas')} || self.rollout.replicas == 0",
        "spec.rollout.replicas",
        "expected 0 for algorithm sft (SFT generates nothing)",
        kinds=("AtlasTraining",),
    )


def _student_rules() -> Iterator[Rule]:
    yield Rule(
        "spec.student.rollout",
        "self.replicas == 0 || !has(self.gpus) || self.gpus == self.tensorParallelSize",
        "spec.student.rollout.gpus",
        "expected spec.student.rollout.tensorParallelSize (unset, it is): GPUs requested = GPUs used, a server uses "
        f"tensorParallelSize x data-parallel GPUs and runs one data-parallel rank ({rules.DATA_PARALLEL_REASON}); "
        "to use more GPUs, raise spec.student.rollout.tensorParallelSize or spec.student.rollout.replicas "
        "(PyTorchJob backend)",
        kinds=("AtlasTeacher",),
    )
    yield Rule(
        "spec",
        f"!{JOBSET} || !{has('student.rollout.replicas')} || self.student.rollout.replicas <= 1",
        "spec.student.rollout.replicas",
        "expected 0 or 1 with the JobSet backend (the trainer reaches the student server by its pod's stable "
        "hostname, so more replicas would hold GPUs and serve nothing)",
        kinds=("AtlasTeacher",),
    )


# max_jobset_run_name(nodes) (atlas_contract.names) is this less the digits of the last node's index, nodes - 1.
JOBSET_NAME_AND_INDEX = max_jobset_run_name(1) + len("0")


def _name_rules() -> Iterator[Rule]:
    yield Rule(
        "",
        f"self.metadata.name.matches('^{DNS_LABEL}$') && size(self.metadata.name) <= {MAX_RUN_NAME}",
        "metadata.name",
        f"expected a DNS label of at most {MAX_RUN_NAME} characters (lowercase letters, digits, '-', starting "
        "with a letter)",
    )
    nodes = value("resources.nodes", _default(ResourcesSpec, "nodes"), root="self.spec")
    yield Rule(
        "",
        f"!(has(self.spec.backend) && self.spec.backend == 'JobSet') || "
        f"size(self.metadata.name) + size(string({nodes} - 1)) <= {JOBSET_NAME_AND_INDEX}",
        "metadata.name",
        f"too long for the JobSet backend: its trainer pods are named <name>-trainer-0-<node>-<5 random>, a DNS "
        f"label of 63 characters (at most {max_jobset_run_name(10)} characters up to 10 nodes)",
    )


# max_trainjob_run_name(nodes) (atlas_contract.names) is this less the digits of the last node's index, nodes - 1.
TRAINJOB_NAME_AND_INDEX = max_trainjob_run_name(1) + len("0")


def _trainjob_rules() -> Iterator[Rule]:
    """What the Kubeflow Trainer (v2.3.0) decides on a TrainJob, refused at apply rather than by its webhook later."""
    nodes = value("resources.nodes", _default(ResourcesSpec, "nodes"), root="self.spec")
    yield Rule(
        "",
        "!(has(self.spec.backend) && self.spec.backend == 'TrainJob') || "
        f"size(self.metadata.name) + size(string({nodes} - 1)) <= {TRAINJOB_NAME_AND_INDEX}",
        "metadata.name",
        "too long for the TrainJob backend: its trainer pods are named <name>-node-0-<node>-<5 random>, a DNS "
        f"label of 63 characters (at most {max_trainjob_run_name(10)} characters up to 10 nodes)",
    )
    yield Rule(
        "spec",
        f"!{TRAINJOB} || !{has('automountServiceAccountToken')} || !self.automountServiceAccountToken",
        "spec.automountServiceAccountToken",
        "expected false with the TrainJob backend: its runtime's pods never mount an API token (a TrainJob "
        "cannot set it for its pods)",
    )


def _reward_rules() -> Iterator[Rule]:
    yield Rule(
        "spec.reward",
        "!(has(self.config) && has(self.configMapRef))",
        "spec.reward",
        "set config or configMapRef, not both",
    )
    known = ", ".join(f"'{name}'" for name in REWARD_FUNCTIONS)
    yield Rule(
        "spec.reward",
        f"!has(self.funcs) || self.funcs.all(f, f in [{known}])",
        "spec.reward.funcs",
        f"expected known reward functions ({', '.join(REWARD_FUNCTIONS)})",
    )
    yield Rule(
        "spec",
        f"!{has('reward.weights')} || size(self.reward.weights) == {REWARD_FUNC_COUNT} + ({JUDGES} ? 1 : 0)",
        "spec.reward.weights",
        "expected one weight per reward function (spec.reward.funcs; exact_match when unset on an AtlasTraining "
        "grpo without judges), then one for the RIM judges",
    )
    yield Rule(
        "spec",
        f"{ALGORITHM} != 'grpo' || {REWARD_FUNC_COUNT} > 0 || {JUDGES}",
        "spec.reward",
        "expected at least one reward function (funcs) or RIM judges (config)",
        kinds=("AtlasTraining",),
    )


def _training_rules() -> Iterator[Rule]:
    yield Rule(
        "spec.resources",
        "!has(self.processesPerNode) || self.gpusPerNode == 0 || self.processesPerNode <= self.gpusPerNode",
        "spec.resources.processesPerNode",
        "expected at most gpusPerNode processes (one per GPU)",
    )
    for name in defaults.GRPO_ONLY:
        yield Rule(
            "spec",
            f"{ALGORITHM} != 'sft' || !{has('training.' + camel(name))}",
            f"spec.training.{camel(name)}",
            "a GRPO setting; algorithm sft does not use it (remove it)",
            kinds=("AtlasTraining",),
        )
    yield Rule(
        "spec.env[*]",
        "!(has(self.value) && has(self.valueFrom))",
        "spec.env[*]",
        "set value or valueFrom, not both",
    )


# The spec fields a checkpoint fixes (see the module's docstring): a change would be silently half-applied.
CHECKPOINT_FIXED = (
    "model",
    "dataset",
    "reward",
    *(f"training.{camel(name)}" for name in ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay")),
    "training.seed",
)


def _unchanged(path: str) -> str:
    now, before = has(path), has(path, root="oldSelf")
    return f"{now} == {before} && (!{now} || self.{path} == oldSelf.{path})"


def _transition_rules() -> Iterator[Rule]:
    for path in CHECKPOINT_FIXED:
        yield Rule(
            "spec",
            _unchanged(path),
            f"spec.{path}",
            "fixed by the run's checkpoints (the trainer would refuse to resume them); create a new run to change it",
            transition=True,
        )
    yield Rule(
        "spec",
        _unchanged("algorithm"),
        "spec.algorithm",
        "fixed by the run's checkpoints (the trainer would refuse to resume them); create a new run to change it",
        kinds=("AtlasTraining",),
        transition=True,
    )
    yield Rule(
        "spec",
        _unchanged("student.model"),
        "spec.student.model",
        "fixed by the run's checkpoints (the trainer would refuse to resume them); create a new run to change it",
        kinds=("AtlasTeacher",),
        transition=True,
    )


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
        entry = {"rule": rule.expression(kind), "message": rule.message}
        if rule.field_path:
            entry["fieldPath"] = rule.field_path
        by_level.setdefault(rule.level, []).append(entry)
    return by_level


# ------------------------------------------------------------------ the operator's enforcement


_compiling = threading.Lock()


def _compiled(kind: str) -> tuple[tuple[Rule, Any], ...]:
    # One compilation per kind, under a lock: the operator's handler threads all validate their first runs at once,
    # and each compiling the rules itself (25 ms with the runtime's imports) stalled a burst of new runs.
    with _compiling:
        return _compile(kind)


@functools.cache
def _compile(kind: str) -> tuple[tuple[Rule, Any], ...]:
    from cel_expr_python import cel  # here: writing the CRDs (python -m atlas_operator.generate) needs no runtime

    env = cel.NewEnv(variables={"self": cel.Type.DYN})
    return tuple((rule, env.compile(rule.expression(kind))) for rule in rules_for(kind) if not rule.transition)


def compile_rules() -> None:
    """Compile every kind's rules now (the operator's start-up), not in the first reconciliations."""
    for kind in sorted({kind for rule in RULES for kind in rule.kinds}):
        _compiled(kind)


def problems(kind: str, name: str, spec: dict[str, Any]) -> list[str]:
    """Every rule ``spec`` (a parsed spec as the API server stores it) and ``name`` break, as
    ``"<field>: <expected>"`` with the item's index for a rule on list items."""
    obj = {"metadata": {"name": name}, "spec": spec}
    found = []
    for rule, program in _compiled(kind):
        for where, node in _nodes(obj, rule.level):
            result = program.eval(data={"self": node}).value()
            if result is not True:
                field = where + rule.field.removeprefix(rule.level) if rule.level else rule.field
                reason = rule.expected if result is False else f"cannot be checked ({result})"
                found.append(f"{field}: {reason}")
    return found


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
