"""The CRDs' rules on a real API server (kube-apiserver, tests/kube/conftest.py) against the operator's validation.

Every manifest is created with ``dryRun=All`` through one client (a few seconds for hundreds): the 422's causes,
``{field, message: "Invalid value: <message>"}``, must be the operator's ``parse_run`` problems ``"<field>:
<message>"`` word for word (each rule's messageExpression, evaluated by cel-go there and by cel-expr-python here).
The CRDs themselves are applied by the ``kube`` fixture: the API server accepting them is the cost-budget check.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes
import pytest
from atlas_operator.cel_rules import FIXED, rules_for
from atlas_operator.validation import parse_run

from atlas_contract.errors import InvalidFields
from atlas_contract.names import API_VERSION, GROUP, KINDS, VERSION
from harness.manifests import teacher, training, with_spec
from tests.support.cel_admission import admission_refusals
from tests.unit.test_cel_validation import CORPUS, EXAMPLES, cel_visible, schema_valid, variants

INVALID = "Invalid value: "
OBJECT_NAME = "a lowercase RFC 1123 subdomain"


@pytest.fixture(scope="module")
def objects(kube):
    return kubernetes.client.CustomObjectsApi(kube.api())


def server_refusals(objects, namespace: str, manifest: dict[str, Any]) -> list[str] | None:
    """The API server's refusal of creating ``manifest`` as ``"<field>: <message>"`` (None: accepted)."""
    body = copy.deepcopy(manifest)
    body["metadata"] = {**body["metadata"], "namespace": namespace}
    try:
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, KINDS[body["kind"]], body, dry_run="All")
    except kubernetes.client.ApiException as exc:
        assert exc.status == 422, exc.body
        causes = json.loads(exc.body)["details"]["causes"]
        # The API server's own check of any object's name (a DNS subdomain) is not a rule of the CRDs.
        return (
            sorted(
                f"{c['field']}: {c['message'].removeprefix(INVALID)}" for c in causes if OBJECT_NAME not in c["message"]
            )
            or None
        )
    return None


def operator_problems(manifest: dict[str, Any]) -> list[str] | None:
    try:
        parse_run(manifest)
    except InvalidFields as invalid:
        return sorted(invalid.problems)
    return None


def disagreement(objects, namespace: str, manifest: dict[str, Any]) -> str | None:
    server, operator = server_refusals(objects, namespace, manifest), operator_problems(manifest)
    if operator is not None:
        operator = sorted(cel_visible(manifest, operator)) or None
    if server == operator:
        return None
    return f"{manifest['metadata']['name']} {manifest['spec']}:\n  API server {server}\n  operator   {operator}"


def test_the_api_server_and_the_operator_refuse_alike(kube, namespace, objects):
    """Examples, the parity corpus's builders and 150 seeded random runs (tests/unit/test_cel_validation.py variants, a
    seed of their own): accepted by both, or refused by both with the same fields and messages."""
    corpus = [m for m in [*CORPUS[: len(CORPUS) - 700], *variants(150, seed=2026)] if schema_valid(m)]
    assert len(corpus) > 100
    found = [d for m in corpus if (d := disagreement(objects, namespace, m))]
    assert found == []


def test_every_rule_is_met_and_broken_on_the_api_server(kube, namespace, objects):
    """For each rule some run breaks it and some run meets it on the real API server, and each refusal there is
    the operator's problem for the same run."""
    corpus = [m for m in CORPUS if schema_valid(m)]
    for kind in KINDS:
        rules = [r for r in rules_for(kind) if not r.transition]
        runs = [m for m in corpus if m["kind"] == kind]
        for rule in rules:
            expression = rule.expression(kind)
            broken = next(m for m in runs if expression in {r.rule for r in admission_refusals(m)})
            met = next(m for m in runs if expression not in {r.rule for r in admission_refusals(m)})
            assert disagreement(objects, namespace, broken) is None, rule.field
            assert disagreement(objects, namespace, met) is None, rule.field
            refused = server_refusals(objects, namespace, broken) or []
            assert any(p.startswith(f"{rule.field.replace('[*]', '[')}") for p in refused), (rule.field, refused)


def test_a_refusal_names_the_values_it_found(kube, namespace, objects):
    manifest = with_spec(training(), rollout={"replicas": 1, "gpus": 6, "tensorParallelSize": 4})
    refused = server_refusals(objects, namespace, manifest)
    assert refused is not None and len(refused) == 1
    assert refused[0].startswith("spec.rollout.gpus: 6 is not spec.rollout.tensorParallelSize (4): ")
    assert refused == operator_problems(manifest)
    batch = training(training={"perDeviceTrainBatchSize": 3, "numGenerations": 5})
    assert (
        server_refusals(objects, namespace, batch)
        == operator_problems(batch)
        == [
            "spec.training.numGenerations: 5 does not divide the generation batch of 48 completions "
            "(perDeviceTrainBatchSize 3 x 16 processes x gradientAccumulationSteps 1)"
        ]
    )


def test_a_change_a_checkpoint_fixes_is_refused_by_the_api_server(kube, namespace, objects):
    """Transition rules: create, then patch; the refusal names the old and the new value."""
    example = copy.deepcopy(next(m for m in EXAMPLES if m["kind"] == "AtlasTraining"))
    example["metadata"] = {"name": "fixed-fields", "namespace": namespace}
    plural = KINDS["AtlasTraining"]
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, example)
    patch = {"spec": {"model": "org/another-model", "training": {"seed": 12345}}}
    with pytest.raises(kubernetes.client.ApiException) as refused:
        objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, "fixed-fields", patch)
    causes = {
        c["field"]: c["message"].removeprefix(INVALID) for c in json.loads(refused.value.body)["details"]["causes"]
    }
    old_model = example["spec"]["model"]
    assert causes["spec.model"] == f"{FIXED}, got was '{old_model}', now 'org/another-model'"
    assert causes["spec.training.seed"].startswith(f"{FIXED}, got was ")
    assert causes["spec.training.seed"].endswith(", now 12345")
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, "fixed-fields", {"spec": {"suspend": True}}
    )
    assert API_VERSION == f"{GROUP}/{VERSION}"


def test_the_builders_are_accepted(kube, namespace, objects):
    for manifest in (training(), teacher()):
        assert server_refusals(objects, namespace, manifest) is None
