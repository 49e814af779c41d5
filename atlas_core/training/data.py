"""Datasets named by a run's ``dataset.source``.

* ``builtin://arithmetic`` — the bundled verifiable task (prompt + ground_truth; prompt +
  completion for SFT);
* a ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or a folder written by ``save_to_disk``
  (in a pod: a path on the mounted PVC);
* ``hf://org/name`` — a hub dataset (needs network; ``HF_HUB_OFFLINE=1`` forbids it).
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_ARITHMETIC = "builtin://arithmetic"
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
):
    """Load the dataset and check its columns for ``algorithm`` (grpo needs ``prompt``)."""
    from datasets import Dataset, load_dataset, load_from_disk

    from atlas_core.tasks.arithmetic import make_arithmetic_dataset, make_sft_dataset

    if source == BUILTIN_ARITHMETIC:
        make = make_sft_dataset if algorithm == "sft" else make_arithmetic_dataset
        return Dataset.from_list(make(num_samples, seed=seed, max_operand=max_operand))
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
    return dataset


def _check_columns(columns: list[str], algorithm: str, source: str) -> None:
    if algorithm == "sft":
        if not ({"prompt", "completion"} <= set(columns) or {"messages"} & set(columns) or "text" in columns):
            raise DatasetSourceError(
                f"dataset.source: '{source}' needs prompt+completion, messages or text columns for SFT "
                f"(columns: {', '.join(columns)})"
            )
    elif "prompt" not in columns:
        raise DatasetSourceError(f"dataset.source: '{source}' has no 'prompt' column (columns: {', '.join(columns)})")
