"""The trained model out: a Hugging Face folder, its model card and its manifest, to S3, a claim or the hub.

:func:`export_model` copies the final model of ``output_dir`` (weights, config, tokenizer, generation config, chat
template: what ``save_model`` writes, never the run's own files) with :data:`~atlas_contract.sources.MODEL_CARD_FILE`
(:func:`model_card`) and :data:`~atlas_contract.sources.MANIFEST_FILE`, the manifest last: a destination without it
holds no whole export (an export cut short leaves none; a manifest of an earlier export is removed first).

- ``s3://bucket/prefix``: boto3's ``upload_file`` per file (multipart for large ones), the manifest last;
- ``pvc://claim/path``: a copy under the claim's mount, each file renamed into place, the manifest last;
- ``hf://org/name``: ``HfApi.upload_folder`` (``HF_TOKEN``, ``HF_ENDPOINT``): one commit, so all or nothing.

Failures are :class:`~atlas_core.sources.errors.SourceError` (a missing bucket or claim: NotFound; a store that does
not answer: Unreachable; credentials: AccessDenied) naming the object.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from atlas_contract.sources import (
    ACCESS_DENIED,
    EXPORT_ADAPTER_DIR,
    MANIFEST_FILE,
    MODEL_CARD_FILE,
    NOT_FOUND,
    UNREACHABLE_WAIT_S,
    local_path,
    parse,
)
from atlas_core.sources import manifest as manifests
from atlas_core.sources.errors import SourceError, from_hub, from_s3

logger = logging.getLogger("atlas_core.sources")

#: The files of a Hugging Face model folder (top level): what ``save_pretrained`` of a model, its tokenizer and
#: generation config write, a PEFT adapter included. Anything else in ``output_dir`` (checkpoints, metrics, the
#: evaluation, training_args.bin, the run's identity) is the run's, not the model's.
MODEL_FILE_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "adapter_model.bin",
    "config.json",
    "generation_config.json",
    "adapter_config.json",
    "tokenizer*.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "adapter_model.bin")


def model_files(model_dir: str | os.PathLike) -> list[str]:
    """The Hugging Face folder's files in ``model_dir`` (names, sorted); ValueError when it holds no saved model."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ValueError(f"{model_dir}: no such folder (no final model to export)")
    names = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and any(fnmatch.fnmatch(p.name, pat) for pat in MODEL_FILE_PATTERNS)
    )
    has_weights = any(fnmatch.fnmatch(n, pat) for n in names for pat in _WEIGHT_PATTERNS)
    if not has_weights or not ({"config.json", "adapter_config.json"} & set(names)):
        raise ValueError(f"{model_dir}: no saved model (weights and config.json) to export")
    adapter = folder / EXPORT_ADAPTER_DIR  # beside a merged model: the adapter it was merged from
    if adapter.is_dir():
        names += [f"{EXPORT_ADAPTER_DIR}/{name}" for name in model_files(adapter)]
    return names


def export_model(
    model_dir: str | os.PathLike,
    uri: str,
    card_text: str,
    *,
    session: Any = None,
    unreachable_wait_s: float = UNREACHABLE_WAIT_S,
) -> dict[str, Any]:
    """Export ``model_dir``'s final model with ``card_text`` as its model card to ``uri``; ``{"uri", "files",
    "bytes"}`` of what was written (the model's files and the card; the manifest lists them). ``session``: the boto3
    Session whose client uploads (default: a new one, reading the environment now)."""
    location = parse(uri)
    if location.scheme not in ("s3", "pvc", "hf"):
        raise ValueError(f"output: '{uri}' is not an export destination (expected s3://, pvc:// or hf://)")
    folder = Path(model_dir)
    names = model_files(folder)
    card = card_text.encode("utf-8")
    entries = manifests.file_entries(folder, names)
    entries.append({"path": MODEL_CARD_FILE, "size": len(card), "sha256": hashlib.sha256(card).hexdigest()})
    manifest = manifests.manifest_of(uri, entries, kind="export")
    text = manifests.manifest_text(manifest)
    started = time.monotonic()
    if location.scheme == "s3":
        _to_s3(location.root, location.path, uri, folder, names, card, text, session, unreachable_wait_s)
    elif location.scheme == "pvc":
        _to_pvc(uri, folder, names, card, text)
    else:
        _to_hub(location.root, uri, folder, names, card, text)
    result = {"uri": uri, "files": manifest["total_files"], "bytes": manifest["total_bytes"]}
    logger.info(
        "exported %s to %s: %d files, %d bytes in %.1f s",
        folder,
        uri,
        result["files"],
        result["bytes"],
        time.monotonic() - started,
    )
    return result


# ------------------------------------------------------------------ S3


def _to_s3(
    bucket: str,
    prefix: str,
    uri: str,
    folder: Path,
    names: list[str],
    card: bytes,
    manifest_text: str,
    session: Any,
    wait_s: float,
) -> None:
    from atlas_core.sources.fetch import _bounded, s3_client

    def key(name: str) -> str:
        return f"{prefix}/{name}" if prefix else name

    probe = s3_client(session, max_attempts=1, connect_timeout=max(1.0, min(10.0, wait_s)))
    endpoint = probe.meta.endpoint_url
    # The bucket first (bounded, for a store that does not answer): a missing bucket is named before any upload.
    _bounded(
        lambda: probe.head_bucket(Bucket=bucket),
        lambda exc: _bucket_error(exc, uri, endpoint, bucket),
        wait_s,
    )
    client = s3_client(session)
    target = f"s3://{bucket}/{key(MANIFEST_FILE)}"
    try:
        _remove_earlier_manifest(client, bucket, key(MANIFEST_FILE), uri, endpoint)
        for name in names:
            target = f"s3://{bucket}/{key(name)}"
            client.upload_file(str(folder / name), bucket, key(name))
        target = f"s3://{bucket}/{key(MODEL_CARD_FILE)}"
        client.put_object(Bucket=bucket, Key=key(MODEL_CARD_FILE), Body=card, ContentType="text/markdown")
        target = f"s3://{bucket}/{key(MANIFEST_FILE)}"
        client.put_object(
            Bucket=bucket, Key=key(MANIFEST_FILE), Body=manifest_text.encode(), ContentType="application/json"
        )
    except SourceError:
        raise
    except Exception as exc:
        error = from_s3(exc, uri, endpoint, target)
        if error is None:
            raise
        raise error from None


def _remove_earlier_manifest(client: Any, bucket: str, key: str, uri: str, endpoint: str) -> None:
    """An earlier export's manifest at the destination is removed first: incomplete until the end. A policy that
    lets this run write but not delete is let be (the new manifest replaces the old one, last)."""
    from botocore.exceptions import ClientError

    try:
        client.delete_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        error = from_s3(exc, uri, endpoint, f"s3://{bucket}/{key}")
        if error is None or error.reason != ACCESS_DENIED:
            raise
        logger.warning("%s: cannot remove the earlier manifest (%s); it is replaced at the end", uri, error.message)


def _bucket_error(exc: BaseException, uri: str, endpoint: str, bucket: str) -> SourceError | None:
    error = from_s3(exc, uri, endpoint, f"s3://{bucket}")
    if error is not None and error.reason == NOT_FOUND:
        return SourceError(NOT_FOUND, uri, f"{uri}: the bucket '{bucket}' does not exist at {endpoint}")
    return error


# ------------------------------------------------------------------ a claim


def _to_pvc(uri: str, folder: Path, names: list[str], card: bytes, manifest_text: str) -> None:
    from atlas_core.sources import pvc_root

    root = pvc_root()
    location = parse(uri)
    mount = Path(root) / location.root
    if not mount.is_dir():
        raise SourceError(
            NOT_FOUND,
            uri,
            f"{uri}: the claim '{location.root}' is not mounted at {mount} (the trainer pod mounts spec.output's "
            "claim there)",
        )
    target = Path(local_path(uri, None, root) or mount)
    current = target / MANIFEST_FILE
    try:
        target.mkdir(parents=True, exist_ok=True)
        current.unlink(missing_ok=True)  # an earlier export's: incomplete until the end
        for name in names:
            current = target / name
            current.parent.mkdir(parents=True, exist_ok=True)  # the adapter's folder beside a merged model
            _copy_into_place(folder / name, current)
        current = target / MODEL_CARD_FILE
        manifests.write_atomically(current, card.decode("utf-8"))
        current = target / MANIFEST_FILE
        manifests.write_atomically(current, manifest_text)
    except PermissionError as exc:
        raise SourceError(ACCESS_DENIED, uri, f"{current}: not writable ({exc.strerror}); {uri}") from None


def _copy_into_place(source: Path, target: Path) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".atlas-{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        shutil.copyfile(source, temporary)
        with open(temporary, "rb+") as out:
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ the hub


def _to_hub(repo_id: str, uri: str, folder: Path, names: list[str], card: bytes, manifest_text: str) -> None:
    """One commit (the hub's commits are atomic: the manifest arrives with the files or not at all)."""
    from huggingface_hub import HfApi

    from atlas_core.sources.fetch import hub_endpoint

    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, token=os.environ.get("HF_TOKEN") or None)
    with tempfile.TemporaryDirectory(prefix="atlas-export-") as staging:
        stage = Path(staging)
        for name in names:
            try:
                os.link(folder / name, stage / name)
            except OSError:
                shutil.copyfile(folder / name, stage / name)
        (stage / MODEL_CARD_FILE).write_bytes(card)
        (stage / MANIFEST_FILE).write_text(manifest_text, encoding="utf-8")
        try:
            api.create_repo(repo_id, repo_type="model", exist_ok=True)
            api.upload_folder(repo_id=repo_id, folder_path=str(stage), commit_message="Atlas: trained model")
        except Exception as exc:
            error = from_hub(exc, uri, endpoint)
            if error is None:
                raise
            raise error from None


# ------------------------------------------------------------------ the model card


def model_card(
    run: Any,
    step: int,
    reward: float | None,
    kl: float | None,
    evaluation: Mapping[str, Any] | None,
    sources: Mapping[str, str | None] | None = None,
) -> str:
    """The model card (Markdown, with the hub's YAML front matter): what was trained from what, the run's
    settings, the final step, reward and KL, and for a teacher its evaluation table. ``run``: the RunConfig;
    ``evaluation``: the evaluation report's fields (``eval.json``); ``sources``: field → URI (default: the run's
    model, student and datasets)."""
    import yaml

    sources = dict(sources) if sources is not None else _run_sources(run)
    front: dict[str, Any] = {}
    base = _hub_id(run.model)
    if base:
        front["base_model"] = base
    front["library_name"] = "transformers"
    front["pipeline_tag"] = "text-generation"
    front["tags"] = ["atlas", run.algorithm, *(["grpo"] if run.algorithm in ("grpo", "teacher") else [])]
    if run.algorithm == "teacher":
        front["tags"].append("teaching")
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "", f"# {run.run_name}", ""]
    lines += [_summary(run), ""]
    lines += ["## Trained from", "", "| | |", "|---|---|"]
    lines += [f"| {field} | `{uri}` |" for field, uri in sources.items() if uri]
    lines += ["", "## Settings", "", "| setting | value |", "|---|---|", f"| algorithm | {run.algorithm} |"]
    if run.dataset.split:
        lines.append(f"| dataset.split | {run.dataset.split} |")
    rewards = [*run.reward.funcs, *([run.reward.config] if run.reward.config else [])]
    if rewards:
        lines.append(f"| reward | {', '.join(rewards)} |")
    for name in sorted(run.trainer):
        lines.append(f"| trainer.{name} | {_cell(run.trainer[name])} |")
    lines += ["", "## Result", "", "| | |", "|---|---|", f"| final step | {int(step)} |"]
    lines.append(f"| reward (last logged) | {_number(reward)} |")
    lines.append(f"| KL (last logged) | {_number(kl)} |")
    if evaluation:
        lines += ["", *_evaluation_table(evaluation)]
    lines += ["", "Trained with Atlas on Kubernetes."]
    return "\n".join(lines) + "\n"


def _run_sources(run: Any) -> dict[str, str | None]:
    sources: dict[str, str | None] = {"model": run.model}
    if run.student:
        sources["student"] = run.student
    sources["dataset"] = run.dataset.source
    if run.evaluation is not None:
        sources["evaluation dataset"] = run.evaluation_source()
    return sources


def _hub_id(model: str) -> str | None:
    try:
        location = parse(model)
    except ValueError:
        return None
    return location.root if location.scheme == "hf" else None


def _summary(run: Any) -> str:
    if run.algorithm == "teacher":
        return (
            f"A teacher trained with GRPO to guide the student `{run.student}`: its reward is the student's "
            "improvement when guided (ATLAS's teaching protocol)."
        )
    if run.algorithm == "grpo":
        return "A policy trained with GRPO on verifiable rewards."
    return "A model fine-tuned with SFT."


def _cell(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text.replace("|", "\\|").replace("\n", " ")


def _number(value: float | None) -> str:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "n/a"
    return f"{value:.4f}"


def _percent(value: Any) -> str:
    return "n/a" if not isinstance(value, (int, float)) else f"{100 * value:.1f}%"


def _points(value: Any) -> str:
    return "n/a" if not isinstance(value, (int, float)) else f"{100 * value:+.1f}"


def _evaluation_table(report: Mapping[str, Any]) -> list[str]:
    """The evaluation's figures: the student alone and guided, the delta in points with its 95% interval, the
    non-degradation rate, the problems and the guidance's length."""
    split = f", split {report['split']}" if report.get("split") else ""
    where = f" on `{report['dataset']}`{split}" if report.get("dataset") else ""
    low, high = report.get("accuracy_delta_low"), report.get("accuracy_delta_high")
    interval = f" (95% interval [{_points(low)}, {_points(high)}])" if low is not None and high is not None else ""
    unit = report.get("token_unit") or "tokens"
    guidance = report.get("guidance_tokens_mean")
    return [
        "## Evaluation",
        "",
        f"The two-pass evaluation after training{where}: the student answers each problem alone and with this "
        f"teacher's guidance, {report.get('samples', '?')} samples each.",
        "",
        "| | |",
        "|---|---|",
        f"| problems | {report.get('problems', 'n/a')} |",
        f"| student alone | {_percent(report.get('student_accuracy'))} |",
        f"| guided | {_percent(report.get('guided_accuracy'))} |",
        f"| delta | {_points(report.get('accuracy_delta'))} points{interval} |",
        f"| non-degradation rate | {_percent(report.get('non_degradation_rate'))} |",
        f"| guidance ({unit}, mean) | {'n/a' if guidance is None else f'{guidance:.1f}'} |",
    ]
