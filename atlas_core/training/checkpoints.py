"""Checkpoints that appear whole or not at all, fenced: transformers' private ``Trainer._save_checkpoint``.

transformers writes ``checkpoint-<N>`` in place, file by file (the weights, each rank's ZeRO shard, the
optimizer, the RNG states, ``trainer_state.json`` last), so a process killed mid-save (SIGKILL at the end of
a pod's grace period, a node lost) leaves a folder that looks like a checkpoint. :class:`AtomicCheckpoints`
has every rank write into ``<output_dir>/.atlas-staging/checkpoint-<N>`` instead; once every rank has written
its part (a barrier), the saving process adds what callbacks put in a checkpoint (``fill_checkpoint``: the run's
identity) and renames the folder to ``<output_dir>/checkpoint-<N>`` — one ``rename`` in one file system, so
resume (atlas_core/training/resume.py) only ever lists complete checkpoints. A leftover staging folder is
removed at the next save.

transformers offers no public hook for where a checkpoint is written; the mixin overrides two private
methods, here only, and :func:`check_fence` fails at import when a transformers upgrade reshapes them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import transformers
from transformers.trainer_utils import rotate_checkpoints

from atlas_contract.names import CHECKPOINT_PREFIX, CHECKPOINT_STAGING_DIR
from atlas_core.training.fences import hook_problems

TESTED_TRANSFORMERS = "5.24.0"  # the release read (constraints.txt pins it)
# Hooked method → its parameters in the tested release; what its source must still do for the hook to hold.
HOOKED = {"_save_checkpoint": ("self", "model", "trial"), "_get_output_dir": ("self", "trial")}
USES = {"_save_checkpoint": ("self._get_output_dir(trial=trial)", "rotate_checkpoints(")}


def fence_problems(trainer_class: type = transformers.Trainer) -> list[str]:
    return hook_problems(trainer_class, "Trainer", HOOKED, USES)


def check_fence() -> None:
    problems = fence_problems()
    if problems:
        raise ImportError(
            f"atlas_core: transformers {transformers.__version__} changed the private Trainer API Atlas hooks into "
            f"(tested with {TESTED_TRANSFORMERS}): {'; '.join(problems)}. Install transformers=={TESTED_TRANSFORMERS} "
            "(constraints.txt) or port atlas_core/training/checkpoints.py"
        )


check_fence()


class AtomicCheckpoints:
    """Mixin before transformers' ``Trainer`` (or a subclass) in a trainer's bases: see the module."""

    _atlas_staging: Path | None = None

    def _get_output_dir(self, trial):
        if self._atlas_staging is not None:  # inside _save_checkpoint: the checkpoint goes to the staging folder
            return str(self._atlas_staging)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        run_dir = Path(super()._get_output_dir(trial))
        step_folder = f"{CHECKPOINT_PREFIX}{self.state.global_step}"
        staging, final = run_dir / CHECKPOINT_STAGING_DIR, run_dir / step_folder
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # what a save cut short left
            staging.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        self._atlas_staging = staging
        try:
            super()._save_checkpoint(model, trial)  # every rank writes its part into staging/checkpoint-<N>
        finally:
            self._atlas_staging = None
        self.accelerator.wait_for_everyone()  # every shard written
        if self.args.should_save:
            written = staging / step_folder
            for callback in self.callback_handler.callbacks:
                fill = getattr(callback, "fill_checkpoint", None)
                if fill is not None:
                    fill(written, self.args, self.state)
            _publish(written, final)
            staging.rmdir()  # empty again: no folder is left beside the checkpoints between saves
            rotate_checkpoints(  # what transformers did in the staging folder, done here
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()  # no rank reads or writes the checkpoint before it is published


def _publish(written: Path, final: Path) -> None:
    """Rename ``written`` to ``final``; an older folder of that name (a start-over rewriting a step) is moved
    into the staging folder first and removed after, so ``final`` is always one complete checkpoint or none."""
    _sync_tree(written)
    replaced = None
    if final.exists():
        replaced = written.parent / f"replaced-{final.name}"
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
    written.rename(final)
    _sync_dir(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def _sync_tree(root: Path) -> None:
    """fsync every file and folder under ``root``: the rename must not be durable before the data is."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())
        _sync_dir(Path(folder))


def _sync_dir(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
