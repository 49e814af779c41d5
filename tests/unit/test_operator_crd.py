"""The CRDs the operator generates from its spec models (and the other generated files): valid, complete, current;
what every example and the status the operator writes must fit."""

from __future__ import annotations

import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from atlas_operator.crd import custom_resource_definition
from atlas_operator.manifests import child_names, render_children
from atlas_operator.status_update import Outcome, status_update
from atlas_operator.validation import parse_run

from harness.env import PYTHON, REPO, python_env
from harness.manifests import teacher, training
from tests.support.k8s_schemas import KUBE_VERSION, crd_jsonschema, openapi_validate, pruned_fields
from tests.support.render import EXAMPLES


def test_generated_files_are_current():
    """crds/, the chart's crds/ and accelerate/*.yaml come from the Python models: never stale."""
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_operator.generate", "--check"], capture_output=True, text=True, env=python_env(), cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    for crd in (REPO / "crds").glob("*.yaml"):
        assert (REPO / "charts/atlas-operator/crds" / crd.name).read_text() == crd.read_text()


@pytest.mark.parametrize("kind", ["AtlasTraining", "AtlasTeacher"])
def test_crd_is_valid_and_complete(kind):
    crd = custom_resource_definition(kind)
    kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
    version = crd["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    if kind == "AtlasTeacher":  # what its teaching did: the evaluation after training
        assert list(columns) == ["Phase", "Step", "Reward", "KL", "Delta", "Age"]
        assert columns["Delta"] == {
            "name": "Delta",
            "type": "number",
            "jsonPath": ".status.result.evaluation.accuracyDelta",
        }
    else:
        assert list(columns) == ["Phase", "Step", "Reward", "KL", "Age"]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["required"]) >= {"model", "dataset"}
    assert spec["properties"]["deepspeed"] == {
        **spec["properties"]["deepspeed"],
        "default": "zero3",
        "enum": ["zero1", "zero2", "zero3", "zero3-offload"],
    }
    assert spec["properties"]["resources"]["properties"]["nodes"]["minimum"] == 1
    if kind == "AtlasTeacher":
        assert "student" in spec["required"] and "teaching" in spec["properties"]
    else:
        assert spec["properties"]["algorithm"]["enum"] == ["grpo", "sft"]
    schema = crd_jsonschema(crd)
    openapi_validate(teacher() if kind == "AtlasTeacher" else training(), schema)
    with pytest.raises(jsonschema.ValidationError):
        bad = training()
        bad["spec"]["resources"]["nodes"] = 0
        openapi_validate(bad, schema)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_match_the_crd_and_render(path):
    for document in yaml.safe_load_all(path.read_text()):
        openapi_validate(document, crd_jsonschema(custom_resource_definition(document["kind"])))
        assert render_children(parse_run(document))


def test_result_status_schema_is_the_contracts_summary():
    """.status.result in the CRD has exactly the keys atlas_contract.results writes, so nothing is pruned."""
    from atlas_contract import results

    for kind in ("AtlasTraining", "AtlasTeacher"):
        crd = custom_resource_definition(kind)
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        result = status["properties"]["result"]
        assert set(result["properties"]) == {"step", "reward", "kl", "evaluation", "evaluationError"}
        assert set(result["properties"]["evaluation"]["properties"]) == set(results.EVALUATION_SUMMARY.values())
        report = {field: 0.5 for field in results.EVALUATION_SUMMARY} | {"problems": 40}
        parsed = results.parse_result_message(results.result_message(12, 0.25, report, "evaluation: failed"))
        assert parsed["evaluationError"] == "evaluation: failed"
        assert (
            pruned_fields({"status": {"result": parsed}}, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []
        )
        openapi_validate(
            {"status": {"result": parsed}}, {"properties": {"status": crd_jsonschema(crd)["properties"]["status"]}}
        )


def test_status_constants_are_the_crds_own():
    """Condition types and status.children keys come from the classes that generate the CRD: one the CRD does not
    declare cannot be set (it would be refused, or pruned, by the API server)."""
    from atlas_operator.reconcile import condition
    from atlas_operator.run_status import CHILD_KEYS, ConditionType

    crd = custom_resource_definition("AtlasTeacher")
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["conditions"]["items"]["properties"]["type"]["enum"] == [str(t) for t in ConditionType]
    assert set(status["children"]["properties"]) == CHILD_KEYS
    with pytest.raises(ValueError):
        condition("Healthy", True, "Fine", "an undeclared condition type")
    undeclared = Outcome("Pending", [], children={"pytorchJob": "x", "volcanoJob": "x"})
    with pytest.raises(ValueError, match="volcanoJob"):
        status_update({}, 1, undeclared, "2026-01-01T00:00:00Z")
    for run in (teacher(), teacher(backend="JobSet"), training(rollout={"replicas": 0})):
        assert set(child_names(parse_run(run))) <= CHILD_KEYS
