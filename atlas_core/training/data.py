"""Datasets named by a run's ``dataset.source``.

* ``builtin://arithmetic`` — the bundled verifiable task (prompt + ground_truth; prompt +
  completion for SFT); ``builtin://teacher-arithmetic`` — teacher-format SFT examples;
  ``builtin://multistep`` and ``builtin://teacher-multistep`` — the teaching task and its teacher warm-up
  (one registry, :data:`BUILTIN_DATASETS`);
* a ``.jsonl``/``.json``/``.csv``/``.parquet`` file (its ``split`` column assigns rows to splits; without
  one the whole file is split ``train``, or, named as the evaluation set, the evaluation set), a folder of one
  such file per split (``train.jsonl``, ``test.jsonl``), or a folder written by ``save_to_disk`` (in a pod: a
  path on the mounted PVC);
* ``s3://bucket/prefix`` — one data file (the object itself) or a folder (every object under ``prefix/``), read
  from its fetched copy (atlas_core/sources: the pods' initializer fetched it; elsewhere it is fetched once into
  ``$ATLAS_CACHE_DIR/sources``); ``pvc://claim/path`` — a file or folder of a PersistentVolumeClaim, read in place
  at its mount (``/mnt/atlas-pvc/<claim>`` in the pods);
* ``hf://org/name`` — a hub dataset (needs network; ``HF_HUB_OFFLINE=1`` forbids it).

Every split is real: a split the source does not have is an error (atlas_contract.datasets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlas_contract import datasets
from atlas_core.tasks import arithmetic, multistep
from atlas_core.training import demonstrations

BUILTIN_ARITHMETIC = "builtin://arithmetic"
BUILTIN_TEACHER_ARITHMETIC = "builtin://teacher-arithmetic"
BUILTIN_MULTISTEP = "builtin://multistep"
BUILTIN_TEACHER_MULTISTEP = "builtin://teacher-multistep"
BUILTIN_SOURCES = tuple(datasets.BUILTINS)
FILE_FORMATS = datasets.FILE_FORMATS
# save_to_disk writes one of these into its folder; another folder of data files holds one file per split.
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")


class DatasetSourceError(ValueError):
    """The dataset cannot be loaded or lacks the columns the algorithm needs."""


def load_run_dataset(
    source: str,
    split: str = "train",
    algorithm: str = "grpo",
    num_samples: int = 512,
    max_operand: int = 9,
    seed: int = 0,
    guided_fraction: float = 0.0,
    prefix: str = "dataset",
    evaluation: bool = False,
    whole_file: bool = False,
):
    """Load ``split`` of the dataset and check its columns for ``algorithm`` (grpo needs ``prompt``).

    ``evaluation``: problems to evaluate a teacher on (not SFT demonstrations); ``prefix`` names the fields in
    errors (``evaluation.dataset`` → ``evaluation.dataset.split: …``). A split the source does not have is an
    error (atlas_contract.datasets), except with ``whole_file``: a data file without a ``split`` column is then
    taken whole, whatever ``split`` (the evaluation set a user named, see :func:`load_evaluation_dataset`)."""

    def name(field: str) -> str:
        return f"{prefix}.{field}"

    if source.startswith(datasets.BUILTIN_SCHEME):
        problems = (
            datasets.evaluation_problems(source, split, prefix)
            if evaluation
            else datasets.dataset_problems(source, split, algorithm, prefix)
        )
        if problems:
            raise DatasetSourceError("\n".join(problems))
        from datasets import Dataset

        request = BuiltinRequest(split, algorithm, num_samples, seed, max_operand, guided_fraction)
        try:
            return Dataset.from_list(BUILTIN_DATASETS[source](request))
        except ValueError as exc:
            raise DatasetSourceError(f"{name('num_samples')}: {exc}") from None
    dataset = _load_external(source, split, name, evaluation, whole_file)
    _check_columns(dataset.column_names, algorithm, source, name)
    _check_rows(dataset, algorithm, source, name)
    return dataset


@dataclass(frozen=True)
class BuiltinRequest:
    """What a run asks of a builtin dataset; each builtin reads the fields it has a use for."""

    split: str
    algorithm: str
    num_samples: int
    seed: int
    max_operand: int
    guided_fraction: float


def _arithmetic(r: BuiltinRequest) -> list[dict[str, Any]]:
    if r.algorithm != "sft":
        return arithmetic.make_arithmetic_dataset(r.num_samples, seed=r.seed, max_operand=r.max_operand, split=r.split)
    rows = arithmetic.make_sft_dataset(r.num_samples, seed=r.seed, max_operand=r.max_operand, split=r.split)
    if r.guided_fraction > 0:
        rows = demonstrations.with_arithmetic_guidance(rows, r.guided_fraction, r.seed, r.max_operand)
    return rows


def _teacher_arithmetic(r: BuiltinRequest) -> list[dict[str, Any]]:
    return demonstrations.make_teacher_sft_dataset(
        "arithmetic", r.num_samples, seed=r.seed, max_operand=r.max_operand, split=r.split
    )


def _multistep(r: BuiltinRequest) -> list[dict[str, Any]]:
    if r.algorithm == "sft":
        return demonstrations.make_student_sft_dataset(r.num_samples, seed=r.seed)
    return multistep.make_multistep_dataset(r.num_samples, r.split, seed=r.seed)


def _teacher_multistep(r: BuiltinRequest) -> list[dict[str, Any]]:
    return demonstrations.make_teacher_sft_dataset("multistep", r.num_samples, seed=r.seed)


#: Every builtin dataset → the rows of a request. Which algorithms and splits each has is the contract's
#: (atlas_contract.datasets.BUILTINS), checked before a loader runs; tests/unit/test_preflight.py keeps the two in step.
BUILTIN_DATASETS: dict[str, Callable[[BuiltinRequest], list[dict[str, Any]]]] = {
    BUILTIN_ARITHMETIC: _arithmetic,
    BUILTIN_TEACHER_ARITHMETIC: _teacher_arithmetic,
    BUILTIN_MULTISTEP: _multistep,
    BUILTIN_TEACHER_MULTISTEP: _teacher_multistep,
}


def _load_external(source: str, split: str, name, evaluation: bool, whole_file: bool):
    """A hub dataset's split, a file's (by its ``split`` column), a folder's (one file per split, or the
    splits save_to_disk wrote)."""
    from datasets import load_dataset, load_from_disk

    try:
        if source.startswith(datasets.HUB_SCHEME):
            return _hub_split(load_dataset, source, split, name)
        path = local_dataset_path(source, name("source"))
        if not path.exists():
            raise DatasetSourceError(f"{name('source')}: '{source}' does not exist")
        if path.is_dir():
            files = split_files(path)
            if files:
                if split not in files:
                    raise DatasetSourceError(
                        datasets.missing_split(source, split, sorted(files), name("split"), evaluation)
                    )
                return _load_file(load_dataset, files[split], source, name)
            dataset = load_from_disk(str(path))
            if hasattr(dataset, "keys"):  # a DatasetDict
                if split not in dataset:
                    raise DatasetSourceError(
                        datasets.missing_split(source, split, list(dataset.keys()), name("split"), evaluation)
                    )
                return dataset[split]
            return _select_split(dataset, source, split, name, evaluation, whole_file)
        if path.suffix in FILE_FORMATS:
            loaded = _load_file(load_dataset, path, source, name)
            return _select_split(loaded, source, split, name, evaluation, whole_file)
        raise DatasetSourceError(
            f"{name('source')}: '{source}' has an unknown format (expected {', '.join(FILE_FORMATS)})"
        )
    except DatasetSourceError:
        raise
    except Exception as exc:  # datasets raises many types; the user needs the source and the reason
        raise DatasetSourceError(f"{name('source')}: cannot load '{source}': {_reason(exc)}") from None


def local_dataset_path(source: str, field: str = "dataset.source") -> Path:
    """Where a dataset source is read on this machine: an ``s3://`` source's fetched copy (fetched first when it is
    not whole: the CLI's case; in a pod the initializer fetched it) — the one file of a single object, else the
    folder —, a ``pvc://`` source's place under the claim's mount, a path as it is. DatasetSourceError naming
    ``field`` when it cannot be fetched, or a claim is not mounted here."""
    from atlas_contract.sources import PVC_SCHEME, S3_SCHEME

    if source.startswith(PVC_SCHEME):
        from atlas_core.sources import mounted_path

        try:
            return Path(mounted_path(source, field, "the file or folder"))
        except ValueError as exc:
            raise DatasetSourceError(str(exc)) from None
    if not source.startswith(S3_SCHEME):
        return Path(source).expanduser()
    from atlas_core.sources import local_copy
    from atlas_core.sources.errors import SourceError
    from atlas_core.sources.fetch import fetch
    from atlas_core.sources.manifest import is_complete, read_manifest

    try:
        folder = local_copy(source)
    except ValueError as exc:  # a malformed URI
        raise DatasetSourceError(f"{field}: {exc}") from None
    assert folder is not None
    if not is_complete(folder, source=source):
        try:
            fetch(source, folder)
        except SourceError as exc:
            raise DatasetSourceError(f"{field}: {exc.reason}: {exc.message}") from None
    manifest = read_manifest(folder) or {}
    files = manifest.get("files") or []
    if manifest.get("kind") == "object" and len(files) == 1:
        return Path(folder) / files[0]["path"]
    return Path(folder)


def split_files(folder: Path) -> dict[str, Path]:
    """A folder's data files by split (``test.jsonl`` is split test); empty for a save_to_disk folder."""
    if any((folder / marker).exists() for marker in _SAVED_DATASET_MARKERS):
        return {}
    return {p.stem: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in FILE_FORMATS}


def _load_file(load_dataset, path: Path, source: str, name):
    if not path.read_bytes().strip():
        raise DatasetSourceError(f"{name('source')}: '{source}' is empty (expected one problem per row)")
    return load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")


def _select_split(dataset, source: str, split: str, name, evaluation: bool, whole_file: bool):
    """The rows of ``split``: by the ``split`` column when there is one; else the whole file is split train (and,
    ``whole_file``, whatever split was asked)."""
    if datasets.SPLIT_COLUMN not in dataset.column_names:
        if split != datasets.WHOLE_FILE_SPLIT and not whole_file:
            raise DatasetSourceError(
                datasets.missing_split(source, split, [datasets.WHOLE_FILE_SPLIT], name("split"), evaluation)
            )
        return dataset
    labels = [str(value) for value in dataset[datasets.SPLIT_COLUMN]]
    if split not in labels:
        raise DatasetSourceError(datasets.missing_split(source, split, sorted(set(labels)), name("split"), evaluation))
    return dataset.select([index for index, label in enumerate(labels) if label == split])


def _hub_split(load_dataset, source: str, split: str, name):
    try:
        return load_dataset(source.removeprefix(datasets.HUB_SCHEME), split=split)
    except ValueError as exc:
        if "Unknown split" in str(exc) or "Bad split" in str(exc):  # datasets' words for a split it lacks
            raise DatasetSourceError(f"{name('split')}: '{source}' has no split '{split}' ({_reason(exc)})") from None
        raise


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


_SHOWN_ROWS = 3  # rows named per problem; the count says how many more


def _check_rows(dataset, algorithm: str, source: str, name) -> None:
    """Every row's text columns before training starts: a prompt (and, for SFT, a completion or text) that
    is a non-empty string or a non-empty list of chat messages, the same kind in every row."""
    if algorithm == "sft":
        columns = [c for c in ("prompt", "completion", "text", "messages") if c in dataset.column_names]
    else:
        columns = ["prompt"]
    problems = []
    for column in columns:
        bad: dict[str, list[int]] = {}
        kinds: dict[str, int] = {}
        for index, value in enumerate(dataset[column]):
            kind, problem = _text_kind(value)
            if problem:
                bad.setdefault(problem, []).append(index)
            else:
                assert kind is not None  # _text_kind gives a kind or a problem
                kinds.setdefault(kind, index)
        for problem, rows in bad.items():
            shown = ", ".join(map(str, rows[:_SHOWN_ROWS])) + (
                f" and {len(rows) - _SHOWN_ROWS} more" if len(rows) > _SHOWN_ROWS else ""
            )
            problems.append(
                f"{name('source')}: '{source}' column {column!r}: {problem} (row{'s' if len(rows) > 1 else ''} {shown})"
            )
        if len(kinds) > 1:
            problems.append(
                f"{name('source')}: '{source}' column {column!r}: mixes plain-text and chat rows "
                f"(row {kinds['text']} is text, row {kinds['chat']} is chat); use one kind"
            )
    if problems:
        raise DatasetSourceError("\n".join(problems))


def _text_kind(value) -> tuple[str | None, str | None]:
    """("text" | "chat", None) for a usable value, else (None, what is wrong)."""
    if isinstance(value, str):
        return ("text", None) if value.strip() else (None, "empty text")
    if isinstance(value, list):
        if not value:
            return None, "an empty message list"
        if all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in value):
            return "chat", None
        return None, "chat messages need a role and a string content"
    return None, f"expected text or chat messages, got {'null' if value is None else type(value).__name__}"


def _check_columns(columns: list[str], algorithm: str, source: str, name) -> None:
    if algorithm == "sft":
        if not ({"prompt", "completion"} <= set(columns) or {"messages"} & set(columns) or "text" in columns):
            raise DatasetSourceError(
                f"{name('source')}: '{source}' needs prompt+completion, messages or text columns for SFT "
                f"(columns: {', '.join(columns)})"
            )
    elif "prompt" not in columns:
        raise DatasetSourceError(f"{name('source')}: '{source}' has no 'prompt' column (columns: {', '.join(columns)})")


def load_evaluation_dataset(
    source: str,
    split: str,
    limit: int | None,
    default_problems: int,
    seed: int = 0,
    max_operand: int = 9,
    prefix: str = "evaluation.dataset",
    notes: list[str] | None = None,
    training_source: str | None = None,
):
    """The problems an evaluation answers: at most ``limit`` of ``split`` (all of a file's split; a generated
    builtin draws ``limit`` or ``default_problems``; builtin://multistep's test split holds a fixed mix, all
    of it at most). The one loader of ``atlas eval``, the evaluation after training and its start-up check.

    A data file without a ``split`` column named as the evaluation set is the evaluation set: evaluated whole,
    whatever ``split``. Unless it is ``training_source`` (the run's training dataset, when there is one): then
    only ``split: train`` evaluates it, so that nothing measures the training data unknowingly."""
    held_out = training_source is not None and same_source(source, training_source)
    wanted = limit or default_problems
    if source == BUILTIN_MULTISTEP and split == "test":
        whole = multistep.test_mix_size()
        if limit and limit > whole and notes is not None:
            notes.append(f"limit {limit}: the test split of {source} holds {whole} problems; evaluating all of them")
        wanted = min(limit or whole, whole)
    dataset = load_run_dataset(
        source,
        split,
        "grpo",
        wanted,
        max_operand=max_operand,
        seed=seed,
        prefix=prefix,
        evaluation=True,
        whole_file=not held_out,
    )
    if notes is not None and split != datasets.WHOLE_FILE_SPLIT and _taken_whole(source, dataset):
        notes.append(f"split {split}: '{source}' has no '{datasets.SPLIT_COLUMN}' column; evaluating the whole file")
    if limit and len(dataset) > limit:
        dataset = dataset.select(range(limit))
    if len(dataset) == 0:
        raise DatasetSourceError(f"{prefix}.source: '{source}' (split {split}) has no problems")
    return dataset


def same_source(a: str, b: str) -> bool:
    """Whether two dataset sources name the same data (a path however spelled)."""
    if a == b:
        return True
    schemes = (datasets.BUILTIN_SCHEME, datasets.HUB_SCHEME, "s3://", "pvc://")
    if a.startswith(schemes) or b.startswith(schemes):
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _taken_whole(source: str, dataset) -> bool:
    """Whether ``dataset`` is a whole data file that had no ``split`` column (a file of a folder per split has none
    either, but is a split)."""
    if source.startswith((datasets.BUILTIN_SCHEME, datasets.HUB_SCHEME)):
        return False
    try:
        path = local_dataset_path(source)
    except DatasetSourceError:
        return False
    return path.is_file() and datasets.SPLIT_COLUMN not in dataset.column_names
