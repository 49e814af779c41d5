"""Models and data in from S3 (atlas_core/sources): fetched once from a real S3 server (harness/s3.py, the
``s3_server`` fixture) with boto3, a manifest written last, a fetch cut short resumed with a Range GET, a whole
copy skipped without a request, each failure named (AccessDenied, NotFound, Unreachable) without a credential, two
processes on one folder, the initializer's exit status and termination message, and a model loaded from S3."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import subprocess
import time
from pathlib import Path

import pytest

from atlas_contract.sources import (
    ACCESS_DENIED,
    MANIFEST_FILE,
    NOT_FOUND,
    SOURCES_EXIT_CODE,
    SOURCES_MARK,
    UNREACHABLE,
    local_path,
)
from harness.env import PYTHON, free_port, python_env

boto3 = pytest.importorskip("boto3")


class Cut(Exception):
    """Raised by a boto3 event handler to cut a fetch short mid-file (boto3's own hook, not a stand-in)."""


def upload_folder(client, bucket: str, prefix: str, folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` under ``prefix/``; {relative path: content}."""
    uploaded = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=path.read_bytes())
        uploaded[rel] = path.read_bytes()
    return uploaded


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """The server's AWS_* in the environment (what boto3 reads), a fresh cache, no pod settings."""
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ATLAS_SOURCES_DIR", raising=False)
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    return s3_server


def range_of(request) -> str | None:
    value = request.headers.get("Range")
    return value.decode() if isinstance(value, bytes) else value


def counting_session(log: list[tuple[str, str | None]]):
    """A boto3 Session whose every request is recorded: (operation, Range header)."""
    session = boto3.session.Session()

    def record(request, event_name, **kwargs):
        log.append((event_name.rsplit(".", 1)[-1], range_of(request)))

    session.events.register("before-send.s3", record)
    return session


# ------------------------------------------------------------------ fetch


def test_a_folder_and_a_single_object_are_fetched_with_their_manifest(s3, tmp_path):
    from atlas_core.sources.fetch import fetch
    from atlas_core.sources.manifest import is_complete, read_manifest

    client, bucket = s3.client(), s3.bucket("fetch-basic")
    source = tmp_path / "source"
    (source / "nested").mkdir(parents=True)
    (source / "config.json").write_text('{"a": 1}')
    (source / "nested" / "weights.bin").write_bytes(os.urandom(70_000))
    (source / "empty.txt").write_bytes(b"")
    uploaded = upload_folder(client, bucket, "models/m1", source)
    client.put_object(Bucket=bucket, Key="models/m1-not-under-the-prefix.txt", Body=b"x")  # a sibling key
    client.put_object(Bucket=bucket, Key="data/problems.jsonl", Body=b'{"prompt": "1+1", "ground_truth": "2"}\n')

    dest = tmp_path / "copy"
    report = fetch(f"s3://{bucket}/models/m1", dest)
    assert (report.files, report.skipped) == (3, False)
    assert report.bytes_total == report.bytes_fetched == sum(len(v) for v in uploaded.values())
    manifest = read_manifest(dest)
    assert manifest["source"] == f"s3://{bucket}/models/m1" and manifest["kind"] == "prefix"
    assert {e["path"]: (e["size"], e["sha256"]) for e in manifest["files"]} == {
        rel: (len(data), sha(data)) for rel, data in uploaded.items()
    }
    assert (manifest["total_files"], manifest["total_bytes"]) == (3, report.bytes_total)
    for rel, data in uploaded.items():
        assert (dest / rel).read_bytes() == data
    assert not list(dest.rglob("*.part")) and not (dest / "m1-not-under-the-prefix.txt").exists()
    newest = max((dest / rel).stat().st_mtime_ns for rel in uploaded)
    assert (dest / MANIFEST_FILE).stat().st_mtime_ns >= newest  # the manifest is the last file written
    assert is_complete(dest, verify=True)

    single = fetch(f"s3://{bucket}/data/problems.jsonl", tmp_path / "one")
    assert (single.files, read_manifest(tmp_path / "one")["kind"]) == (1, "object")
    assert (tmp_path / "one" / "problems.jsonl").read_bytes().startswith(b'{"prompt"')

    (dest / "nested" / "weights.bin").write_bytes(b"short")  # damaged: no longer whole
    assert not is_complete(dest)
    again = fetch(f"s3://{bucket}/models/m1", dest)
    assert not again.skipped and again.bytes_fetched == 70_000  # only the damaged file again
    assert is_complete(dest, verify=True)


def test_a_fetch_cut_short_is_resumed_with_a_range_get_and_a_whole_copy_is_skipped(s3, tmp_path):
    from atlas_core.sources.fetch import fetch
    from atlas_core.sources.manifest import is_complete, read_manifest

    client, bucket = s3.client(), s3.bucket("fetch-resume")
    big, small = os.urandom(3 * 1024 * 1024 + 123), b"small file"
    client.put_object(Bucket=bucket, Key="m/a-small.txt", Body=small)
    client.put_object(Bucket=bucket, Key="m/big.bin", Body=big)
    uri, dest, part = f"s3://{bucket}/m", tmp_path / "copy", 1024 * 1024

    cut = boto3.session.Session()
    gets = []

    def cut_on_the_second_part(request, **kwargs):
        if request.url.endswith("/m/big.bin"):
            gets.append(range_of(request))
            if len(gets) == 2:
                raise Cut("connection lost")

    cut.events.register("before-send.s3.GetObject", cut_on_the_second_part)
    with pytest.raises(Cut):
        fetch(uri, dest, session=cut, part_bytes=part)
    assert read_manifest(dest) is None and not is_complete(dest)  # no manifest: incomplete
    assert (dest / "a-small.txt").read_bytes() == small
    assert (dest / "big.bin.part").stat().st_size == part and not (dest / "big.bin").exists()

    log: list[tuple[str, str | None]] = []
    report = fetch(uri, dest, session=counting_session(log), part_bytes=part)
    ranges = [r for op, r in log if op == "GetObject"]
    assert ranges[0] == f"bytes={part}-{2 * part - 1}"  # resumed where the .part ends
    assert len(ranges) == 3  # the rest of big.bin in parts; a-small.txt, whole already, not again
    assert report.bytes_fetched == len(big) - part < report.bytes_total == len(big) + len(small)
    assert (dest / "big.bin").read_bytes() == big and not (dest / "big.bin.part").exists()
    assert {e["path"]: e["sha256"] for e in read_manifest(dest)["files"]} == {
        "a-small.txt": sha(small),
        "big.bin": sha(big),
    }

    log.clear()
    skipped = fetch(uri, dest, session=counting_session(log))
    assert skipped.skipped and log == []  # a whole copy: not a single request
    assert (skipped.files, skipped.bytes_fetched, skipped.bytes_total) == (2, 0, len(big) + len(small))


def test_wrong_credentials_a_missing_prefix_and_bucket_are_named(s3, tmp_path, monkeypatch):
    from atlas_core.sources.errors import SourceError
    from atlas_core.sources.fetch import fetch

    client, bucket = s3.client(), s3.bucket("fetch-errors")
    client.put_object(Bucket=bucket, Key="m/config.json", Body=b"{}")

    with pytest.raises(SourceError) as missing:
        fetch(f"s3://{bucket}/no/such/prefix", tmp_path / "a")
    assert missing.value.reason == NOT_FOUND
    assert f"s3://{bucket}/no/such/prefix" in missing.value.message
    with pytest.raises(SourceError) as no_bucket:
        fetch("s3://no-such-bucket-here/m", tmp_path / "b")
    assert no_bucket.value.reason == NOT_FOUND and "s3://no-such-bucket-here/m" in no_bucket.value.message
    assert not (tmp_path / "a" / MANIFEST_FILE).exists()

    secret = "wrong-secret-0123456789-abcdefghijkl"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(SourceError) as denied:
        fetch(f"s3://{bucket}/m", tmp_path / "c")
    error = denied.value
    assert error.reason == ACCESS_DENIED and error.uri == f"s3://{bucket}/m"
    assert f"s3://{bucket}/m" in error.message and s3.endpoint in error.message
    for text in (error.message, str(error), repr(error), json.dumps(error.to_dict())):
        assert secret not in text and s3.secret_key not in text


def test_an_endpoint_that_does_not_answer_fails_within_the_wait_naming_it(s3, tmp_path, monkeypatch):
    from atlas_core.sources.errors import SourceError
    from atlas_core.sources.fetch import fetch

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    started = time.monotonic()
    with pytest.raises(SourceError) as unreachable:
        fetch("s3://some-bucket/model", tmp_path / "copy", unreachable_wait_s=1.5)
    elapsed = time.monotonic() - started
    assert unreachable.value.reason == UNREACHABLE and endpoint in unreachable.value.message
    assert "1.5 s" in unreachable.value.message
    assert 1.0 <= elapsed < 8, elapsed  # asked again within the wait, then given up: bounded


def _fetch_in_a_process(uri, dest, barrier, queue, env):
    os.environ.update(env)
    from atlas_core.sources.fetch import fetch

    gets = []
    session = boto3.session.Session()

    def slow(request, **kwargs):  # each part a little slow, so that the other process comes while this one fetches
        gets.append(range_of(request))
        time.sleep(0.1)

    session.events.register("before-send.s3.GetObject", slow)
    barrier.wait(timeout=60)
    report = fetch(uri, dest, session=session, part_bytes=256 * 1024, lock_wait_s=60)
    queue.put((report.skipped, report.bytes_fetched, len(gets)))


def test_two_processes_fetching_one_source_into_one_folder_fetch_it_once(s3, tmp_path):
    from atlas_core.sources.manifest import is_complete

    client, bucket = s3.client(), s3.bucket("fetch-shared")
    data = os.urandom(2 * 1024 * 1024)
    client.put_object(Bucket=bucket, Key="shared/weights.bin", Body=data)
    uri, dest = f"s3://{bucket}/shared", tmp_path / "volume" / "copy"
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(2), context.Queue()
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "ATLAS_"))}
    workers = [context.Process(target=_fetch_in_a_process, args=(uri, dest, barrier, queue, env)) for _ in range(2)]
    for worker in workers:
        worker.start()
    results = sorted(queue.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    (fetched_skipped, fetched_bytes, fetched_gets), (waited_skipped, waited_bytes, waited_gets) = results
    assert (fetched_skipped, fetched_bytes, fetched_gets) == (False, len(data), 8)  # one downloads
    assert (waited_skipped, waited_bytes, waited_gets) == (True, 0, 0)  # the other waits, then skips
    assert is_complete(dest, verify=True)
    assert [p.name for p in dest.parent.iterdir() if p.name.endswith(".json")] == []
    assert sorted(p.name for p in dest.iterdir()) == sorted([".atlas-fetch.json", MANIFEST_FILE, "weights.bin"])


# ------------------------------------------------------------------ the initializer


def _run_yaml(path: Path, **fields) -> Path:
    import yaml

    config = {
        "algorithm": "teacher",
        "model": "builtin://tiny-llama",
        "student": "http://127.0.0.1:1/v1",
        "run_name": "r",
        "output_dir": str(path.parent / "out"),
        "dataset": {"source": "builtin://multistep"},
        "trainer": {},
        **fields,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def initializer(args: list[str], **env):
    return subprocess.run(
        [PYTHON, "-m", "atlas_core.sources.initializer", *args],
        env=python_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_initializer_fetches_a_runs_sources_or_ends_with_its_reason(s3, tmp_path):
    client, bucket = s3.client(), s3.bucket("init")
    client.put_object(Bucket=bucket, Key="model/config.json", Body=b"{}")
    client.put_object(Bucket=bucket, Key="data/train.jsonl", Body=b'{"prompt": "p"}\n')
    sources, message = tmp_path / "sources", tmp_path / "termination-log"
    env = {**s3.env(), "ATLAS_SOURCES_DIR": str(sources)}

    good = _run_yaml(
        tmp_path / "good.yaml",
        model=f"s3://{bucket}/model",
        dataset={"source": f"s3://{bucket}/data/train.jsonl"},
        evaluation={"dataset": {"source": "hf://org/held-out"}},  # a hub dataset: not fetched
    )
    proc = initializer(["--config", str(good), "--message-file", str(message)], **env)
    assert proc.returncode == 0, proc.stderr
    assert not message.exists()  # nothing written when every source is whole
    for uri in (f"s3://{bucket}/model", f"s3://{bucket}/data/train.jsonl"):
        assert (Path(local_path(uri, str(sources))) / MANIFEST_FILE).is_file()
        assert f"fetched {uri}" in proc.stderr
    assert len(list(sources.iterdir())) == 4  # two copies, and their locks
    again = initializer(["--config", str(good), "--message-file", str(message)], **env)
    assert again.returncode == 0 and again.stderr.count("complete: skipped") == 2

    bad = _run_yaml(tmp_path / "bad.yaml", model=f"s3://{bucket}/model", student=f"s3://{bucket}/nothing-here")
    proc = initializer(["--config", str(bad), "--message-file", str(message)], **env)
    assert proc.returncode == SOURCES_EXIT_CODE, proc.stderr
    text = message.read_text()
    assert text.startswith(SOURCES_MARK + " ")
    error = json.loads(text.removeprefix(SOURCES_MARK + " "))
    assert (error["reason"], error["uri"]) == (NOT_FOUND, f"s3://{bucket}/nothing-here")
    assert f"s3://{bucket}/nothing-here" in error["message"]
    assert f"error: student: NotFound: s3://{bucket}/nothing-here" in proc.stderr

    denied = initializer(
        ["--uri", f"s3://{bucket}/model", "--message-file", str(message), "--sources-dir", str(tmp_path / "other")],
        **{**env, "AWS_SECRET_ACCESS_KEY": "not-the-secret-at-all"},
    )
    assert denied.returncode == SOURCES_EXIT_CODE
    error = json.loads(message.read_text().removeprefix(SOURCES_MARK + " "))
    assert error["reason"] == ACCESS_DENIED and "not-the-secret-at-all" not in message.read_text() + denied.stderr


def test_the_initializer_names_a_hub_that_does_not_answer(tmp_path):
    """No hub is reachable here: HF_ENDPOINT on a closed port, within a short wait (the hub's error classes)."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    message = tmp_path / "termination-log"
    env = python_env(HF_ENDPOINT=endpoint, ATLAS_SOURCES_DIR=str(tmp_path / "sources"), HF_TOKEN="hf_secret_token_x1")
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_core.sources.initializer", "--uri", "hf://org/model", "--message-file", str(message)]
        + ["--unreachable-wait-s", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == SOURCES_EXIT_CODE, proc.stderr
    error = json.loads(message.read_text().removeprefix(SOURCES_MARK + " "))
    assert (error["reason"], error["uri"]) == (UNREACHABLE, "hf://org/model")
    assert endpoint in error["message"] and "hf_secret_token_x1" not in message.read_text() + proc.stderr


# ------------------------------------------------------------------ loading from the local copy


def test_a_model_and_datasets_load_from_s3(s3, tmp_path, tiny_model_dir, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atlas_core.models.tiny import resolve_model_path
    from atlas_core.training.data import DatasetSourceError, load_evaluation_dataset, load_run_dataset

    client, bucket = s3.client(), s3.bucket("load")
    upload_folder(client, bucket, "models/tiny", tiny_model_dir)
    rows = [{"prompt": f"What is {i}+1?", "ground_truth": str(i + 1)} for i in range(5)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    client.put_object(Bucket=bucket, Key="data/problems.jsonl", Body=body)
    client.put_object(Bucket=bucket, Key="split/train.jsonl", Body=body)
    client.put_object(Bucket=bucket, Key="split/test.jsonl", Body=body[: body.index(b"\n") + 1])

    uri = f"s3://{bucket}/models/tiny"
    folder = resolve_model_path(uri)
    assert folder == local_path(uri, str(tmp_path / "cache" / "sources"))
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), original.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(folder)("What is 2+2?")["input_ids"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # the store gone: the copy serves
    assert resolve_model_path(uri) == folder

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    single = load_run_dataset(f"s3://{bucket}/data/problems.jsonl", split="train")
    assert single.to_list() == rows
    test = load_evaluation_dataset(f"s3://{bucket}/split", "test", None, default_problems=10)
    assert test.to_list() == rows[:1]
    with pytest.raises(DatasetSourceError, match=r"dataset.source: NotFound: .*s3://load/none"):
        load_run_dataset(f"s3://{bucket}/none", split="train")


def test_pvc_sources_read_at_the_claims_mount_or_name_the_field(tmp_path, monkeypatch, tiny_model_dir):
    import shutil

    from atlas_core.models.tiny import resolve_model_path
    from atlas_core.training.data import DatasetSourceError, load_run_dataset

    monkeypatch.setenv("ATLAS_PVC_ROOT", str(tmp_path / "mnt"))
    with pytest.raises(ValueError, match=r"^student: 'pvc://claim/m' is read from the PersistentVolumeClaim 'claim'"):
        resolve_model_path("pvc://claim/m", field="student")
    with pytest.raises(DatasetSourceError, match=r"^dataset.source: .*not mounted here: give the path"):
        load_run_dataset("pvc://data-claim/problems.jsonl", split="train")

    shutil.copytree(tiny_model_dir, tmp_path / "mnt" / "claim" / "m")
    (tmp_path / "mnt" / "data-claim").mkdir()
    (tmp_path / "mnt" / "data-claim" / "problems.jsonl").write_text('{"prompt": "What is 1+1?"}\n')
    assert resolve_model_path("pvc://claim/m") == str(tmp_path / "mnt" / "claim" / "m")
    assert load_run_dataset("pvc://data-claim/problems.jsonl", split="train")["prompt"] == ["What is 1+1?"]
