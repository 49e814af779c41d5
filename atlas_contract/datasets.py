"""What a run's datasets must be, checked before anything loads: the one preflight of every dataset a run reads.

The operator (``validate_run``, so a bad run is ``Invalid`` before any child exists), ``atlas render`` /
``atlas train`` / ``atlas eval`` and the trainer's start-up check (``validate_run_config``) all call
:func:`dataset_problems` for the training dataset and for the evaluation's, each naming the fields the way
its user wrote them (``spec.evaluation.dataset.source`` in a manifest, ``evaluation.dataset.source`` in a run
configuration). What needs the data itself (a file's columns and its ``split`` column) is checked where the
file is local, by ``atlas_core.training.data``.

Splits: every builtin has the splits listed in :data:`BUILTINS`; a data file has the values of its ``split``
column, else one split, ``train`` (its whole content, as ``datasets`` names a file's rows); a folder of one
file per split (``train.jsonl``, ``test.jsonl``) has those; a hub dataset has its own. A split a source
does not have is an error, so an evaluation never measures training data unless it names ``split: train``;
except that a data file without a ``split`` column named as the evaluation set (``atlas eval --dataset``, a run's
own ``evaluation.dataset.source`` other than its training one) is the evaluation set, evaluated whole
(``atlas_core.training.data.load_evaluation_dataset``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

BUILTIN_SCHEME = "builtin://"
HUB_SCHEME = "hf://"
#: Data-file suffix → the ``datasets`` loader that reads it.
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
#: The split of a data file without a ``split`` column: its whole content.
WHOLE_FILE_SPLIT = "train"
#: The column that assigns a data file's rows to splits.
SPLIT_COLUMN = "split"


@dataclass(frozen=True)
class Builtin:
    """A bundled dataset: the algorithms that train on it and its splits (problems to evaluate unless SFT-only)."""

    algorithms: tuple[str, ...]
    splits: tuple[str, ...]
    sft_splits: tuple[str, ...] = ("train",)  # SFT trains on worked examples of the training problems only

    @property
    def evaluable(self) -> bool:
        """Problems with a ground truth (not SFT-only demonstrations)."""
        return self.algorithms != ("sft",)


BUILTINS: dict[str, Builtin] = {
    "builtin://arithmetic": Builtin(("grpo", "teacher", "sft"), ("train", "test")),
    "builtin://teacher-arithmetic": Builtin(("sft",), ("train",)),
    "builtin://multistep": Builtin(("grpo", "teacher", "sft"), ("train", "test")),
    "builtin://teacher-multistep": Builtin(("sft",), ("train",)),
}


def _at(prefix: str) -> Callable[[str], str]:
    return lambda field: f"{prefix}.{field}" if prefix else field


def dataset_problems(source: str, split: str, algorithm: str, prefix: str = "dataset", local: bool = True) -> list[str]:
    """Problems of a training dataset (``algorithm``: grpo, teacher, sft) known without loading it: an unknown
    builtin, a builtin of another algorithm, a split the builtin lacks, and (``local``: the path is on this
    machine) a missing path or an unknown file format. ``prefix`` spells the fields (``spec.dataset``)."""
    name = _at(prefix)
    if source.startswith(BUILTIN_SCHEME):
        builtin = BUILTINS.get(source)
        if builtin is None:
            return [f"{name('source')}: unknown builtin '{source}' (available: {', '.join(BUILTINS)})"]
        if algorithm not in builtin.algorithms:
            return [f"{name('source')}: '{source}' is an SFT dataset (use algorithm sft)"]
        splits = builtin.sft_splits if algorithm == "sft" else builtin.splits
        if split not in splits:
            return [f"{name('split')}: '{source}' has {splits_text(splits)} for algorithm {algorithm}, got '{split}'"]
        return []
    return _path_problems(source, name) if local else []


def evaluation_problems(
    source: str, split: str, prefix: str = "evaluation.dataset", local: bool = True, training: str | None = None
) -> list[str]:
    """Problems of an evaluation dataset known without loading it: as :func:`dataset_problems`, and it must be
    problems to answer (not SFT demonstrations). ``training``: the run's training source, named in the hint
    when the evaluation has no held-out split of it."""
    name = _at(prefix)
    if source.startswith(BUILTIN_SCHEME):
        builtin = BUILTINS.get(source)
        if builtin is None:
            return [f"{name('source')}: unknown builtin '{source}' (available: {', '.join(BUILTINS)})"]
        if not builtin.evaluable:
            evaluable = ", ".join(s for s, b in BUILTINS.items() if b.evaluable)
            return [
                f"{name('source')}: '{source}' is an SFT dataset (demonstrations, no problems to answer); expected "
                f"a dataset of problems ({evaluable}, a file, hf://…)"
            ]
        if split not in builtin.splits:
            return [f"{name('split')}: '{source}' has {splits_text(builtin.splits)}, got '{split}'"]
        return []
    return _path_problems(source, name) if local else []


def missing_split(source: str, split: str, splits: list[str], field: str, evaluation: bool) -> str:
    """The message for a split a loaded source does not have; for an evaluation, how to evaluate anyway."""
    message = f"{field}: '{source}' has no split '{split}' (it has {splits_text(splits)})"
    if evaluation and splits == [WHOLE_FILE_SPLIT]:
        message += (
            f": no held-out split; give held-out problems (a '{SPLIT_COLUMN}' column, a file per split, another "
            f"source), or set split: {WHOLE_FILE_SPLIT} to evaluate on the training data knowingly"
        )
    return message


def _path_problems(source: str, name: Callable[[str], str]) -> list[str]:
    from atlas_contract import sources

    if source.startswith((sources.S3_SCHEME, sources.PVC_SCHEME)):  # what it holds is checked once it is fetched
        return sources.uri_problems(source, name("source"))
    if source.startswith(HUB_SCHEME):
        return [] if source.removeprefix(HUB_SCHEME).strip("/") else [f"{name('source')}: expected hf://org/name"]
    path = Path(os.path.expanduser(source))
    if not path.exists():
        return [f"{name('source')}: '{source}' does not exist"]
    if path.is_file() and path.suffix not in FILE_FORMATS:
        return [f"{name('source')}: '{source}' has an unknown format (expected {', '.join(FILE_FORMATS)})"]
    return []


def splits_text(splits: Iterable[str]) -> str:
    """How a message names ``splits`` ("split train", "splits train, test", "splits none"); the CRD's rules too."""
    splits = list(splits)
    return f"split{'s' if len(splits) != 1 else ''} {', '.join(splits) or 'none'}"
