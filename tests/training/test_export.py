"""The trained model out (atlas_core/sources/export.py): the tiny model exported to a real S3 server
(harness/s3.py) and to a claim's mount, the manifest the last object written and every file's sha256 in it,
a missing bucket named with the local model untouched, ``atlas eval --teacher s3://…`` on an export giving the
local folder's figures, and a teacher run whose export fails, then succeeds on its re-run without training or
evaluating again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from atlas_contract import results
from atlas_contract.sources import MANIFEST_FILE, MODEL_CARD_FILE, NOT_FOUND, SOURCES_EXIT_CODE

boto3 = pytest.importorskip("boto3")

#: What save_pretrained of the tiny model and its tokenizer writes (atlas_tiny_spec.json, the builder's own, is not).
MODEL_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folder_state(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha(p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ATLAS_SOURCES_DIR", raising=False)
    return s3_server


def tiny_card() -> str:
    from atlas_contract.run_config import RunConfig
    from atlas_core.sources.export import model_card

    run = RunConfig.from_dict(
        {
            "algorithm": "teacher",
            "model": "hf://org/base-model",
            "student": "s3://bucket/student",
            "run_name": "teacher-1",
            "output_dir": "/out",
            "dataset": {"source": "s3://bucket/data/train.jsonl", "split": "train"},
            "trainer": {"learning_rate": 0.0003, "max_steps": 10},
            "evaluation": {"samples": 4, "dataset": {"source": "pvc://claim/test.jsonl"}},
        }
    )
    evaluation = {
        "problems": 200,
        "student_accuracy": 0.41,
        "guided_accuracy": 0.63,
        "accuracy_delta": 0.22,
        "accuracy_delta_low": 0.15,
        "accuracy_delta_high": 0.29,
        "non_degradation_rate": 0.975,
        "guidance_tokens_mean": 31.25,
        "samples": 4,
        "dataset": "pvc://claim/test.jsonl",
        "split": "test",
    }
    return model_card(run, 10, 0.61, 0.0123, evaluation)


def test_the_model_card_says_what_was_trained_from_what_and_how_it_did():
    import yaml

    card = tiny_card()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["base_model"] == "org/base-model" and front["library_name"] == "transformers"
    assert {"atlas", "teacher", "grpo"} <= set(front["tags"])
    for line in (
        "| model | `hf://org/base-model` |",
        "| student | `s3://bucket/student` |",
        "| dataset | `s3://bucket/data/train.jsonl` |",
        "| evaluation dataset | `pvc://claim/test.jsonl` |",
        "| algorithm | teacher |",
        "| trainer.learning_rate | 0.0003 |",
        "| final step | 10 |",
        "| reward (last logged) | 0.6100 |",
        "| KL (last logged) | 0.0123 |",
        "| problems | 200 |",
        "| student alone | 41.0% |",
        "| guided | 63.0% |",
        "| delta | +22.0 points (95% interval [+15.0, +29.0]) |",
        "| non-degradation rate | 97.5% |",
        "| guidance (tokens, mean) | 31.2 |",
    ):
        assert line in card.splitlines(), line


def test_export_to_s3_writes_the_manifest_last(s3, tiny_model_dir):
    from atlas_core.sources.export import export_model

    client, bucket = s3.client(), s3.bucket("export-s3")
    session, sent = boto3.session.Session(), []
    session.events.register(
        "before-send.s3", lambda request, event_name, **kw: sent.append((event_name.rsplit(".", 1)[-1], request.url))
    )
    card = tiny_card()
    local = folder_state(tiny_model_dir)
    output = export_model(tiny_model_dir, f"s3://{bucket}/teachers/t1", card, session=session)

    written = [url.split(f"/{bucket}/", 1)[1] for op, url in sent if op in ("PutObject", "CompleteMultipartUpload")]
    assert written[-1] == f"teachers/t1/{MANIFEST_FILE}"  # the last object written
    assert sorted(written[:-1]) == sorted(f"teachers/t1/{name}" for name in [*MODEL_FILES, MODEL_CARD_FILE])
    assert [op for op, _ in sent if op == "DeleteObject"] == ["DeleteObject"]  # an earlier manifest, before all
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="teachers/t1/")["Contents"]}
    assert keys == {f"teachers/t1/{n}" for n in [*MODEL_FILES, MODEL_CARD_FILE, MANIFEST_FILE]}

    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"teachers/t1/{MANIFEST_FILE}")["Body"].read())
    assert manifest["source"] == f"s3://{bucket}/teachers/t1"
    for entry in manifest["files"]:
        body = client.get_object(Bucket=bucket, Key=f"teachers/t1/{entry['path']}")["Body"].read()
        assert (len(body), sha(body)) == (entry["size"], entry["sha256"]), entry["path"]
        if entry["path"] != MODEL_CARD_FILE:
            assert local[entry["path"]] == entry["sha256"]
    card_body = client.get_object(Bucket=bucket, Key=f"teachers/t1/{MODEL_CARD_FILE}")["Body"].read()
    assert card_body.decode() == card
    assert output == {"uri": f"s3://{bucket}/teachers/t1", "files": 7, "bytes": manifest["total_bytes"]}


def test_export_to_a_claim_and_to_a_missing_bucket_or_claim(s3, tiny_model_dir, tmp_path, monkeypatch):
    from atlas_core.sources.errors import SourceError
    from atlas_core.sources.export import export_model
    from atlas_core.sources.manifest import is_complete, read_manifest

    monkeypatch.setenv("ATLAS_PVC_ROOT", str(tmp_path / "mnt"))
    (tmp_path / "mnt" / "models").mkdir(parents=True)
    before = folder_state(tiny_model_dir)
    output = export_model(tiny_model_dir, "pvc://models/teachers/t1", tiny_card())
    target = tmp_path / "mnt" / "models" / "teachers" / "t1"
    assert output == {"uri": "pvc://models/teachers/t1", "files": 7, "bytes": read_manifest(target)["total_bytes"]}
    assert {p.name for p in target.iterdir()} == {*MODEL_FILES, MODEL_CARD_FILE, MANIFEST_FILE}
    assert is_complete(target, verify=True)
    newest = max(p.stat().st_mtime_ns for p in target.iterdir() if p.name != MANIFEST_FILE)
    assert (target / MANIFEST_FILE).stat().st_mtime_ns >= newest
    assert {e["path"]: e["sha256"] for e in read_manifest(target)["files"] if e["path"] != MODEL_CARD_FILE} == {
        name: before[name] for name in MODEL_FILES
    }

    with pytest.raises(SourceError) as no_claim:
        export_model(tiny_model_dir, "pvc://other-claim/t1", tiny_card())
    assert no_claim.value.reason == NOT_FOUND and "other-claim" in no_claim.value.message

    with pytest.raises(SourceError) as no_bucket:
        export_model(tiny_model_dir, "s3://no-such-export-bucket/t1", tiny_card())
    assert no_bucket.value.reason == NOT_FOUND
    assert "the bucket 'no-such-export-bucket' does not exist" in no_bucket.value.message
    assert folder_state(tiny_model_dir) == before  # the local model untouched


def test_atlas_eval_reads_an_exported_teacher_back_from_s3(s3, tiny_model_dir, tmp_path, atlas_cache, capsys):
    from atlas_cli.main import main as atlas
    from atlas_core.sources.export import export_model

    bucket = s3.bucket("export-eval")
    export_model(tiny_model_dir, f"s3://{bucket}/teacher", tiny_card())
    small = ["--limit", "2", "-k", "1", "--teacher-max-tokens", "8", "--student-max-tokens", "4"]
    small += ["--max-probe-tokens", "4", "--student", "builtin://tiny-llama", "--dataset", "builtin://multistep"]
    small += ["--student-temperature", "0", "--teacher-temperature", "0"]  # greedy: the same answers each time
    reports, records = {}, {}
    for name, teacher in (("s3", f"s3://{bucket}/teacher"), ("local", str(tiny_model_dir))):
        code = atlas(["eval", "--teacher", teacher, "--output", str(tmp_path / name), *small])
        assert code == 0, capsys.readouterr().err[-3000:]
        reports[name] = json.loads((tmp_path / name / "eval.json").read_text())
        lines = (tmp_path / name / "problems.jsonl").read_text().splitlines()
        records[name] = [{k: v for k, v in json.loads(line).items() if k != "fingerprint"} for line in lines]
    assert reports["s3"].pop("teacher") == f"s3://{bucket}/teacher"
    reports["local"].pop("teacher")
    assert reports["s3"] == reports["local"] and records["s3"] == records["local"]

    assert atlas(["eval", "--teacher", "s3://Bad_Bucket/x", "--output", str(tmp_path / "bad"), *small]) == 2
    assert "error: --teacher: 's3://Bad_Bucket/x' is not a valid URI (expected s3://<bucket>/<prefix>" in (
        capsys.readouterr().err
    )


def test_a_failed_export_fails_the_pod_and_its_re_run_retries_only_the_export(s3, tmp_path, monkeypatch, capfd):
    """A real teacher run (one step, an evaluation of two problems) exporting to a bucket that does not exist yet:
    the model stays in output_dir, the result carries exportError and the trainer exits SOURCES_EXIT_CODE; the
    re-run (the bucket there now) trains nothing, reports the evaluation from its files and exports."""
    from atlas_core.cli.train import main

    bucket = "export-run-later"
    out, result_file = tmp_path / "run", tmp_path / "termination-log"
    monkeypatch.setenv("ATLAS_RESULT_FILE", str(result_file))
    overrides = [
        "recipe=tiny_teacher",
        f"output_dir={out}",
        "dataset.source=builtin://multistep",
        "trainer.max_steps=1",
        "trainer.per_device_train_batch_size=4",
        "trainer.num_generations=2",
        "trainer.max_completion_length=8",
        "trainer.metrics_port=0",
        "+evaluation={samples: 1, limit: 2}",
        f"+output={{uri: 's3://{bucket}/teacher'}}",
    ]
    assert main(overrides) == SOURCES_EXIT_CODE
    stderr = capfd.readouterr().err
    failed = results.parse_result_message(result_file.read_text())
    assert failed["step"] == 1 and "evaluation" in failed and "output" not in failed
    assert failed["exportError"]["reason"] == NOT_FOUND
    assert f"the bucket '{bucket}' does not exist" in failed["exportError"]["message"]
    assert f"the model stays in {out}" in stderr and (out / "model.safetensors").is_file()
    evaluated = (out / "evaluation" / "problems.jsonl").read_text()
    report_mtime = (out / "evaluation" / "eval.json").stat().st_mtime_ns

    s3.bucket(bucket)
    result_file.unlink()
    assert main(overrides) == 0
    stderr = capfd.readouterr().err
    assert "already finished" in stderr
    assert (out / "evaluation" / "problems.jsonl").read_text() == evaluated  # not evaluated again
    assert (out / "evaluation" / "eval.json").stat().st_mtime_ns == report_mtime
    done = results.parse_result_message(result_file.read_text())
    assert done["evaluation"] == failed["evaluation"] and "exportError" not in done
    client = s3.client()
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"teacher/{MANIFEST_FILE}")["Body"].read())
    assert done["output"] == {"uri": f"s3://{bucket}/teacher", "files": 7, "bytes": manifest["total_bytes"]}
    assert {e["path"] for e in manifest["files"]} == {*MODEL_FILES, MODEL_CARD_FILE}
    card = client.get_object(Bucket=bucket, Key=f"teacher/{MODEL_CARD_FILE}")["Body"].read().decode()
    assert "| final step | 1 |" in card and "| problems | 2 |" in card
    assert "| KL (last logged) | n/a |" not in card and "| reward (last logged) | n/a |" not in card


def test_a_lora_adapter_is_exported_merged_into_its_base_when_asked(tiny_model_dir, tmp_path, monkeypatch):
    """output.merge: the adapter in output_dir merged into its base model, exported as a whole model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atlas_contract.run_config import RunConfig
    from atlas_core.training.finish import export_trained_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    adapter = tmp_path / "run"
    peft_model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(adapter)
    expected = peft_model.merge_and_unload().state_dict()

    monkeypatch.setenv("ATLAS_PVC_ROOT", str(tmp_path / "mnt"))
    (tmp_path / "mnt" / "models").mkdir(parents=True)
    run = RunConfig.from_dict(
        {
            "algorithm": "grpo",
            "model": str(tiny_model_dir),
            "run_name": "lora",
            "output_dir": str(adapter),
            "dataset": {"source": "builtin://arithmetic"},
            "output": {"uri": "pvc://models/merged", "merge": True},
        }
    )
    output, error = export_trained_model(run, 3, 0.5, 0.01, None)
    assert error is None and output["uri"] == "pvc://models/merged"
    exported = tmp_path / "mnt" / "models" / "merged"
    assert not (exported / "adapter_config.json").exists() and (exported / "model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[name], expected[name]) for name in expected)
    assert not [p for p in adapter.iterdir() if p.name.startswith(".atlas-merged")]  # the staging folder removed
    # ... and the adapter it was merged from, as PEFT wrote it, in adapter/ (listed by the manifest, written last)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (exported / "adapter" / name).read_bytes() == (adapter / name).read_bytes()
    listed = {e["path"] for e in json.loads((exported / MANIFEST_FILE).read_text())["files"]}
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors", "model.safetensors"} <= listed


def test_an_adapter_naming_its_base_by_reference_loads_merged(tmp_path):
    """A LoRA run's adapter names the run's model reference (builtin://, s3://, a hub id), not the pod's copy of it:
    loading it resolves the base as any model reference and merges the adapter (atlas eval --teacher, the
    evaluation after training)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from atlas_core.models.loading import load_causal_lm, load_tokenizer
    from atlas_core.models.tiny import TINY_MODEL_URI, resolve_model_path
    from atlas_core.training.lora import name_adapter_base

    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY_MODEL_URI))
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["v_proj"], init_lora_weights=False))
    folder = tmp_path / "adapter"
    peft_model.save_pretrained(folder)
    assert name_adapter_base(folder, TINY_MODEL_URI)
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == TINY_MODEL_URI
    expected = peft_model.merge_and_unload().state_dict()
    loaded = load_causal_lm(str(folder)).state_dict()
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert load_tokenizer(str(folder))("1+1")["input_ids"]  # no tokenizer saved beside it: the base's
