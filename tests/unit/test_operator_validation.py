"""Validation of runs and operator settings (atlas_operator.validation, atlas_operator.config): every problem named by
its field, at once, as Kubernetes and Kueue would check it."""

from __future__ import annotations

import re

import jsonschema
import pytest
from atlas_operator.crd import custom_resource_definition
from atlas_operator.manifests import render_children
from atlas_operator.validation import parse_run

from atlas_contract.errors import InvalidFields
from harness.manifests import teacher, training, with_spec
from tests.support.k8s_schemas import crd_jsonschema, openapi_validate
from tests.support.render import POLICIES, problem_fields


def test_backend_queue_name_and_max_restarts_fields():
    run = parse_run(teacher(queueName="q"))
    assert run.spec.backend is None and run.spec.max_restarts == 3 and run.spec.queue_name == "q"
    assert parse_run(teacher(backend="PyTorchJob")).spec.backend == "PyTorchJob"
    on_jobset = parse_run(teacher(backend="JobSet"))  # rendered now: one JobSet instead of a PyTorchJob
    assert on_jobset.backend == "JobSet"
    assert [c["kind"] for c in render_children(on_jobset)] == [*POLICIES, "ConfigMap", "Service", "JobSet"]
    assert parse_run(teacher()).backend == "PyTorchJob"  # unset, and no operator default: PyTorchJob
    with pytest.raises(InvalidFields, match="spec.backend"):
        parse_run(teacher(backend="Deployment"))
    with pytest.raises(InvalidFields, match="spec.maxRestarts"):
        parse_run(teacher(maxRestarts=-1))
    for bad in ("-q", "a b", "x" * 64):
        with pytest.raises(InvalidFields, match="spec.queueName"):
            parse_run(teacher(queueName=bad))


@pytest.mark.parametrize("kind", ["AtlasTraining", "AtlasTeacher"])
def test_termination_grace_period_defaults_to_the_contracts_and_is_at_least_one_second(kind):
    """spec.terminationGracePeriodSeconds: 600 unset (the CRD default and the parsed run), at least 1 for the operator
    and the API server alike, documented with how to choose it."""
    make = training if kind == "AtlasTraining" else teacher
    assert parse_run(make()).spec.termination_grace_period_seconds == 600
    assert parse_run(make(terminationGracePeriodSeconds=1)).spec.termination_grace_period_seconds == 1
    crd = crd_jsonschema(custom_resource_definition(kind))
    field = crd["properties"]["spec"]["properties"]["terminationGracePeriodSeconds"]
    assert field["type"] == "integer" and field["default"] == 600 and field["minimum"] == 1
    assert "step in flight" in field["description"] and "save" in field["description"]
    for bad in (0, -5, "ten"):
        with pytest.raises(InvalidFields, match="spec.terminationGracePeriodSeconds"):
            parse_run(make(terminationGracePeriodSeconds=bad))
        with pytest.raises(jsonschema.ValidationError):  # the API server refuses it too
            openapi_validate(make(terminationGracePeriodSeconds=bad), crd)


def test_queue_name_is_what_kueues_webhook_accepts():
    """Kueue's job webhook takes the queue-name label as a DNS-1123 subdomain (ValidateLabelAsCRDName): a name it
    would reject makes the run Invalid, naming the field, rather than a job the API server refuses (ChildRejected);
    the CRD's pattern refuses it at kubectl apply."""
    crd = custom_resource_definition("AtlasTeacher")
    pattern = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["queueName"]
    for bad in ("Team_A.x", "team_a", "Team-A", "a..b", "team-a.", ".team"):
        with pytest.raises(InvalidFields, match=r"spec.queueName: expected a LocalQueue name as Kueue accepts it"):
            parse_run(teacher(queueName=bad))
        assert not re.search(pattern["pattern"], bad), bad
    for good in ("q", "team-a", "team-a.gpus", "0team", "a" * 63):
        assert parse_run(teacher(queueName=good)).spec.queue_name == good
        assert re.search(pattern["pattern"], good)


def test_default_backend_setting():
    from atlas_operator.config import OperatorConfig

    assert OperatorConfig.from_env({}).default_backend == "PyTorchJob"
    assert OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "PyTorchJob"}).default_backend == "PyTorchJob"
    with pytest.raises(SystemExit, match="ATLAS_DEFAULT_BACKEND: expected one of PyTorchJob, JobSet"):
        OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "Pod"})
    assert OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "JobSet"}).default_backend == "JobSet"
    # The flag (atlas render/operator --default-backend) wins over the environment.
    assert OperatorConfig.from_env(
        {"ATLAS_DEFAULT_BACKEND": "JobSet"}, default_backend="PyTorchJob"
    ).default_backend == ("PyTorchJob")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"training": {"perDeviceTrainBatchSize": 3, "numGenerations": 5}},
            "spec.training.numGenerations: 5 does not divide",
        ),
        (
            {"rollout": {"replicas": 1, "gpus": 3, "tensorParallelSize": 2}},
            "spec.rollout.gpus: 3 is not spec.rollout.tensorParallelSize (2)",
        ),
        ({"rollout": {"replicas": 2}}, "spec.rollout.replicas: expected 0 or 1"),
        ({"deepspeed": "zero4"}, "spec.deepspeed: expected one of zero1, zero2, zero3, zero3-offload"),
        ({"resources": {"nodes": 0}}, "spec.resources.nodes: expected a number >= 1"),
        ({"resources": {"gpusPerNode": "eight"}}, "spec.resources.gpusPerNode: expected a whole number"),
        ({"trainingg": {}}, "spec.trainingg: unknown field"),
        ({"reward": {"config": "nope"}}, "spec.reward.config: expected one of interpretation"),
        ({"reward": {"funcs": ["made_up"]}}, "spec.reward.funcs: expected known reward functions"),
        (
            {"env": [{"name": "KEY", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            "spec.env[0]: set value or valueFrom, not both",
        ),
        ({"algorithm": "sft", "rollout": {"replicas": 0}, "training": {"beta": 0.1}}, "spec.training.beta: a GRPO"),
    ],
)
def test_invalid_specs_name_the_field(change, expected):
    with pytest.raises(InvalidFields) as caught:
        parse_run(with_spec(training(), **change))
    assert any(expected in p for p in caught.value.problems), caught.value.problems


@pytest.mark.parametrize("kind", ["AtlasTraining", "AtlasTeacher"])
def test_lora_in_extra_is_refused_naming_spec_training_lora(kind):
    """LoRA is spec.training.lora: spec.training.extra's lora (a field of its own in the spec) and peft_config (TRL's
    trainer argument, which the trainer builds from it) are refused, each naming the field to use."""
    build = teacher if kind == "AtlasTeacher" else training
    batch = {"perDeviceTrainBatchSize": 4, "numGenerations": 4}
    with pytest.raises(InvalidFields) as caught:
        parse_run(build(training={**batch, "extra": {"lora": {"r": 8}, "peft_config": {"r": 8}}}))
    assert caught.value.problems == [
        "spec.training.extra.lora: set it as spec.training.lora instead",
        "spec.training.extra.peft_config: set spec.training.lora instead (the trainer builds PEFT's LoraConfig from "
        "it, TRL's peft_config)",
    ]
    assert parse_run(build(training={**batch, "lora": {"r": 8}})).spec.training.lora.r == 8


def test_every_problem_is_reported_at_once():
    manifest = teacher(
        training={"perDeviceTrainBatchSize": 3, "numGenerations": 5},
        rollout={"replicas": 1, "gpus": 3, "tensorParallelSize": 2},
        deepspeed="zero9",
    )
    del manifest["spec"]["student"]
    assert problem_fields(manifest) == [
        "spec.deepspeed",
        "spec.rollout.gpus",
        "spec.student",
        "spec.training.numGenerations",
    ]
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"gpus": 3, "tensorParallelSize": 2}}
    assert problem_fields(manifest) == [
        "spec.deepspeed",
        "spec.rollout.gpus",
        "spec.student.rollout.gpus",
        "spec.training.numGenerations",
    ]


@pytest.mark.parametrize(
    ("resources", "field"),
    [({"cpu": "lots"}, "cpu"), ({"memory": "2 GB"}, "memory"), ({"shmSize": "big"}, "shmSize")],
)
def test_quantities_are_checked_as_kubernetes_checks_them(resources, field):
    """A bad quantity is Invalid at once (and refused by the CRD's anchored pattern), never a child the API
    server rejects over and over."""
    import jsonschema

    with pytest.raises(InvalidFields) as caught:
        parse_run(with_spec(training(), resources=resources))
    assert caught.value.problems == [
        f"spec.resources.{field}: expected a Kubernetes quantity such as 32, 500m, 16Gi or 1.5e3, "
        f"got {resources[field]!r}"
    ]
    schema = custom_resource_definition("AtlasTraining")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    prop = schema["properties"]["spec"]["properties"]["resources"]["properties"][field]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(resources[field], {"type": "string", "pattern": prop["pattern"]})
    for good in ("32", "500m", "16Gi", "1.5e3"):
        jsonschema.validate(good, {"type": "string", "pattern": prop["pattern"]})
        parse_run(with_spec(training(), resources={field: good}))


def test_operator_settings_are_checked_at_start_up():
    """An interval of 0 would re-read every run in a hot loop: refused with one line naming the setting."""
    from atlas_operator.config import OperatorConfig

    with pytest.raises(SystemExit) as caught:
        OperatorConfig.from_env({"ATLAS_PROGRESS_INTERVAL": "0", "ATLAS_OPERATOR_METRICS_PORT": "70000"})
    assert str(caught.value).splitlines() == [
        "error: ATLAS_PROGRESS_INTERVAL: expected at least 1.0, got 0.0",
        "error: ATLAS_OPERATOR_METRICS_PORT: expected between 0 and 65535, got 70000",
    ]
    with pytest.raises(SystemExit, match="ATLAS_WORKERS: invalid literal"):
        OperatorConfig.from_env({"ATLAS_WORKERS": "many"})
    assert OperatorConfig.from_env({}, progress_interval=2.5).progress_interval == 2.5


@pytest.mark.parametrize(
    ("evaluation", "expected"),
    [
        ({"samples": 0}, "spec.evaluation.samples: expected a number >= 1, got 0"),
        ({"samples": "four"}, "spec.evaluation.samples: expected a whole number, got 'four'"),
        ({"samples": 1.5}, "spec.evaluation.samples: expected a whole number, got 1.5"),
        ({"limit": 0}, "spec.evaluation.limit: expected a number >= 1, got 0"),
        ({"limit": -3}, "spec.evaluation.limit: expected a number >= 1, got -3"),
        ({"dataset": {"split": ""}}, "spec.evaluation.dataset.split: expected a split name such as test or validation"),
        ({"dataset": {"split": 3}}, "spec.evaluation.dataset.split: expected a string, got 3"),
        ({"dataset": {"source": ["a"]}}, "spec.evaluation.dataset.source: expected a string"),
        ({"dataset": "test"}, "spec.evaluation.dataset: expected an object"),
        ({"sample": 2}, "spec.evaluation.sample: unknown field (known: dataset, samples, limit)"),
        ("yes", "spec.evaluation: expected an object"),
    ],
)
def test_invalid_evaluation_names_the_field(evaluation, expected):
    with pytest.raises(InvalidFields) as caught:
        parse_run(teacher(evaluation=evaluation))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_evaluation_problems_come_with_every_other_problem_and_only_for_teachers():
    manifest = teacher(evaluation={"samples": 0, "limit": 0, "dataset": {"split": " "}}, training={"numGenerations": 5})
    assert problem_fields(manifest) == [
        "spec.evaluation.dataset.split",
        "spec.evaluation.limit",
        "spec.evaluation.samples",
        "spec.training.numGenerations",
    ]
    with pytest.raises(InvalidFields) as caught:  # AtlasTraining has no evaluation: the teacher is evaluated
        parse_run(training(evaluation={"samples": 2}))
    assert [p.split(" (known")[0] for p in caught.value.problems] == ["spec.evaluation: unknown field"]
    assert (
        "evaluation"
        not in crd_jsonschema(custom_resource_definition("AtlasTraining"))["properties"]["spec"]["properties"]
    )
    spec = crd_jsonschema(custom_resource_definition("AtlasTeacher"))["properties"]["spec"]
    evaluation = spec["properties"]["evaluation"]["properties"]
    assert evaluation["samples"]["minimum"] == 1 and evaluation["samples"]["default"] == 4
    assert evaluation["limit"]["minimum"] == 1 and "default" not in evaluation["limit"]
    assert evaluation["dataset"]["properties"]["split"]["default"] == "test"
    with pytest.raises(jsonschema.ValidationError):  # the API server refuses it too
        openapi_validate(teacher(evaluation={"samples": 0}), crd_jsonschema(custom_resource_definition("AtlasTeacher")))


def test_a_run_name_must_start_with_a_letter():
    """Its Services (<name>-metrics, ...) and a JobSet's Jobs take DNS-1035 names, which begin with a letter."""
    for name in ("1run", "9-teacher"):
        assert problem_fields(training(name)) == ["metadata.name"]
    assert parse_run(training("r1")).name == "r1"
