"""Datasets named by a run's ``dataset.source``.

* ``builtin://arithmetic`` — the bundled verifiable task (prompt + ground_truth; prompt +
  completion for SFT); ``builtin://teacher-arithmetic`` — teacher-format SFT examples;
* a ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or a folder written by ``save_to_disk``
  (in a pod: a path on the mounted PVC);
* ``hf://org/name`` — a hub dataset (needs network; ``HF_HUB_OFFLINE=1`` forbids it).
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_ARITHMETIC = "builtin://arithmetic"
BUILTIN_TEACHER_ARITHMETIC = "builtin://teacher-arithmetic"
BUILTIN_MULTISTEP = "builtin://multistep"
BUILTIN_TEACHER_MULTISTEP = "builtin://teacher-multistep"
BUILTIN_SOURCES = (BUILTIN_ARITHMETIC, BUILTIN_TEACHER_ARITHMETIC, BUILTIN_MULTISTEP, BUILTIN_TEACHER_MULTISTEP)
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


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
):
    """Load the dataset and check its columns for ``algorithm`` (grpo needs ``prompt``)."""
    from datasets import Dataset, load_dataset, load_from_disk

    from atlas_core.tasks.arithmetic import make_arithmetic_dataset, make_sft_dataset

    if source == BUILTIN_ARITHMETIC:
        make = make_sft_dataset if algorithm == "sft" else make_arithmetic_dataset
        rows = make(num_samples, seed=seed, max_operand=max_operand)
        if algorithm == "sft" and guided_fraction > 0:
            rows = _with_guidance(rows, guided_fraction, seed, max_operand)
        return Dataset.from_list(rows)
    if source == BUILTIN_TEACHER_ARITHMETIC:
        from atlas_core.training.teaching import make_teacher_sft_dataset

        if algorithm != "sft":
            raise DatasetSourceError(f"dataset.source: '{source}' is an SFT dataset (use algorithm sft)")
        return Dataset.from_list(make_teacher_sft_dataset(num_samples, seed=seed, max_operand=max_operand))
    if source in (BUILTIN_MULTISTEP, BUILTIN_TEACHER_MULTISTEP):
        return Dataset.from_list(_multistep_rows(source, split, algorithm, num_samples, seed))
    try:
        if source.startswith("hf://"):
            dataset = load_dataset(source.removeprefix("hf://"), split=split)
        else:
            path = Path(source).expanduser()
            if not path.exists():
                raise DatasetSourceError(f"dataset.source: '{source}' does not exist")
            if path.is_dir():
                dataset = load_from_disk(str(path))
                if hasattr(dataset, "keys"):  # a DatasetDict
                    if split not in dataset:
                        raise DatasetSourceError(
                            f"dataset.split: '{split}' not in '{source}' (splits: {', '.join(dataset.keys())})"
                        )
                    dataset = dataset[split]
            elif path.suffix in FILE_FORMATS:
                dataset = load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")
            else:
                raise DatasetSourceError(
                    f"dataset.source: '{source}' has an unknown format (expected {', '.join(FILE_FORMATS)})"
                )
    except DatasetSourceError:
        raise
    except Exception as exc:  # datasets raises many types; the user needs the source and the reason
        reason = " ".join(str(exc).split())[:300]
        raise DatasetSourceError(f"dataset.source: cannot load '{source}': {reason}") from None
    _check_columns(dataset.column_names, algorithm, source)
    _check_rows(dataset, algorithm, source)
    return dataset


_SHOWN_ROWS = 3  # rows named per problem; the count says how many more


def _check_rows(dataset, algorithm: str, source: str) -> None:
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
                kinds.setdefault(kind, index)
        for problem, rows in bad.items():
            shown = ", ".join(map(str, rows[:_SHOWN_ROWS])) + (
                f" and {len(rows) - _SHOWN_ROWS} more" if len(rows) > _SHOWN_ROWS else ""
            )
            problems.append(
                f"dataset.source: '{source}' column {column!r}: {problem} (row{'s' if len(rows) > 1 else ''} {shown})"
            )
        if len(kinds) > 1:
            problems.append(
                f"dataset.source: '{source}' column {column!r}: mixes plain-text and chat rows "
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


def _with_guidance(rows: list[dict], fraction: float, seed: int, max_operand: int) -> list[dict]:
    """Show a share of the SFT tasks with teacher guidance, as the teacher protocol will, so that a
    student warmed up on them reads guidance instead of being thrown by it."""
    import random

    from atlas_core.tasks.arithmetic import guidance_text, make_arithmetic_dataset
    from atlas_core.training.teaching import enhanced_messages

    rng = random.Random(seed)
    problems = make_arithmetic_dataset(len(rows), seed=seed, max_operand=max_operand)
    for row, problem in zip(rows, problems, strict=True):
        if rng.random() < fraction:
            row["prompt"] = enhanced_messages(problem["prompt"][0]["content"], guidance_text(problem))
    return rows


def _multistep_rows(source: str, split: str, algorithm: str, num_samples: int, seed: int) -> list[dict]:
    from atlas_core.tasks import multistep

    if split not in multistep.SPLITS:
        raise DatasetSourceError(f"dataset.split: '{source}' has splits {', '.join(multistep.SPLITS)}, got '{split}'")
    if algorithm == "sft" and split != "train":
        raise DatasetSourceError(f"dataset.split: '{source}' trains only on its 'train' split, got '{split}'")
    try:
        if source == BUILTIN_TEACHER_MULTISTEP:
            if algorithm != "sft":
                raise DatasetSourceError(f"dataset.source: '{source}' is an SFT dataset (use algorithm sft)")
            return multistep.make_teacher_sft_dataset(num_samples, seed=seed)
        if algorithm == "sft":
            return multistep.make_student_sft_dataset(num_samples, seed=seed)
        return multistep.make_multistep_dataset(num_samples, split, seed=seed)
    except ValueError as exc:
        raise DatasetSourceError(f"dataset.num_samples: {exc}") from None


def _check_columns(columns: list[str], algorithm: str, source: str) -> None:
    if algorithm == "sft":
        if not ({"prompt", "completion"} <= set(columns) or {"messages"} & set(columns) or "text" in columns):
            raise DatasetSourceError(
                f"dataset.source: '{source}' needs prompt+completion, messages or text columns for SFT "
                f"(columns: {', '.join(columns)})"
            )
    elif "prompt" not in columns:
        raise DatasetSourceError(f"dataset.source: '{source}' has no 'prompt' column (columns: {', '.join(columns)})")
