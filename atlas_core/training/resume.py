"""One resume decision for the whole job: every rank resumes from the same checkpoint, or none trains.

Each rank lists the ``checkpoint-N`` folders of its output folder and, for each, the files *it* would
read to resume there (the trainer state, its own RNG state, its ZeRO shard and DeepSpeed's ``latest``,
or the weights and optimizer without DeepSpeed). The ranks exchange these views in one collective
before any training step, then all apply the same rule to the same data, so they reach the same
decision without a second collective:

- the newest checkpoint every rank can load is the one all resume from (a newer one that some rank
  cannot load is skipped, and the log names the rank and the missing file);
- no checkpoint that every rank can load, while some rank has one: with ``resume: auto`` every rank
  stops with one reason (the output folder is not shared by every node: set ``spec.checkpoint.pvc``
  to a ReadWriteMany claim); with ``resume: start_over`` every rank starts at step 1, logged loudly;
- ``resume: never`` ignores checkpoints.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from atlas_contract.errors import InvalidFields
from atlas_contract.names import CHECKPOINT_PREFIX

RESUME_POLICIES = ("auto", "start_over", "never")


def resume_policy(value) -> str:
    """``resume`` of a run configuration: auto (true), start_over, never (false)."""
    if value is True or value == "auto":
        return "auto"
    if value is False or value == "never":
        return "never"
    if value == "start_over":
        return "start_over"
    raise InvalidFields([f"resume: expected auto (true), start_over or never (false), got {value!r}"])


@dataclass
class RankView:
    """What one rank can resume from: checkpoint step → the files this rank needs there that are missing."""

    rank: int
    node: str
    output_dir: str
    checkpoints: dict[int, list[str]] = field(default_factory=dict)

    def loadable(self) -> set[int]:
        return {step for step, missing in self.checkpoints.items() if not missing}


@dataclass
class Decision:
    step: int | None  # the checkpoint every rank resumes from; None = start at step 1
    stop: str | None = None  # the reason every rank stops with, instead of training
    notes: list[str] = field(default_factory=list)  # what every rank logs (a skipped checkpoint, a start-over)


def checkpoint_steps(output_dir: str | os.PathLike) -> list[int]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        step = child.name.removeprefix(CHECKPOINT_PREFIX)
        if child.name.startswith(CHECKPOINT_PREFIX) and step.isdigit() and child.is_dir():
            steps.append(int(step))
    return sorted(steps)


def missing_files(checkpoint: Path, rank: int, world_size: int, deepspeed: bool) -> list[str]:
    """The files rank ``rank`` reads to resume from ``checkpoint`` that are not there (paths relative to it)."""
    missing = []
    if not (checkpoint / "trainer_state.json").is_file():  # every rank reads the global step from it
        missing.append("trainer_state.json")
    rng = f"rng_state_{rank}.pth" if world_size > 1 else "rng_state.pth"
    if not (checkpoint / rng).is_file():
        missing.append(rng)
    if deepspeed:
        step = checkpoint.name.removeprefix(CHECKPOINT_PREFIX)
        if not (checkpoint / "latest").is_file():  # DeepSpeed's pointer to global_step<N>
            missing.append("latest")
        shard_dir = checkpoint / f"global_step{step}"
        if not list(shard_dir.glob(f"*zero_pp_rank_{rank}_*optim_states.pt")):
            missing.append(f"global_step{step}/*zero_pp_rank_{rank}_*optim_states.pt (this rank's ZeRO shard)")
        model_states = [
            shard_dir / "mp_rank_00_model_states.pt",
            shard_dir / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt",
        ]
        if not any(p.is_file() for p in model_states):
            missing.append(f"global_step{step}/mp_rank_00_model_states.pt")
    else:
        weights = (
            "model.safetensors",
            "pytorch_model.bin",
            "adapter_model.safetensors",
            "model.safetensors.index.json",
        )
        if not any((checkpoint / name).is_file() for name in weights):
            missing.append("model.safetensors")
        if not (checkpoint / "optimizer.pt").is_file():
            missing.append("optimizer.pt")
    return missing


def node_name() -> str:
    """How a log names this rank's node: its host (the pod's name) and node rank when launched on several."""
    node_rank = os.environ.get("PET_NODE_RANK") or os.environ.get("GROUP_RANK")
    host = socket.gethostname()
    return f"{host} (node {node_rank})" if node_rank is not None else host


def rank_view(output_dir: str | os.PathLike, rank: int, world_size: int, deepspeed: bool) -> RankView:
    root = Path(output_dir)
    checkpoints = {
        step: missing_files(root / f"{CHECKPOINT_PREFIX}{step}", rank, world_size, deepspeed)
        for step in checkpoint_steps(root)
    }
    return RankView(rank=rank, node=node_name(), output_dir=str(root), checkpoints=checkpoints)


def decide(views: list[RankView], policy: str) -> Decision:
    """The same decision on every rank, from every rank's view."""
    if policy == "never":
        return Decision(None)
    views = sorted(views, key=lambda v: v.rank)
    common = set.intersection(*(v.loadable() for v in views)) if views else set()
    newest_any = max((s for v in views for s in v.loadable()), default=None)
    notes = []
    if newest_any is not None and (not common or newest_any > max(common)):
        notes.append(_unreadable(views, newest_any))
    if common:
        step = max(common)
        if notes:
            notes.append(f"every rank resumes from {CHECKPOINT_PREFIX}{step}, the newest checkpoint all ranks can load")
        return Decision(step, notes=notes)
    if newest_any is None:
        return Decision(None)  # nothing to resume from anywhere: a fresh start
    if policy == "start_over":
        notes.append(
            f"resume: start_over: no checkpoint every rank can load, so EVERY RANK STARTS OVER AT STEP 1 "
            f"(the checkpoints in {views[0].output_dir} are kept and overwritten as training saves new ones)"
        )
        return Decision(None, notes=notes)
    return Decision(
        None,
        stop=(
            f"{notes[0]}. No checkpoint is loadable by every rank, so no rank trains (resuming at different steps "
            "would run mismatched collectives). The output folder must be storage every node shares: set "
            "spec.checkpoint.pvc to a ReadWriteMany PersistentVolumeClaim (locally: one output_dir every process "
            "sees), or set resume: start_over in the run configuration to start over on every rank"
        ),
        notes=notes,
    )


def _unreadable(views: list[RankView], step: int) -> str:
    """Which ranks cannot load checkpoint ``step`` and why."""
    holders = [v for v in views if step in v.loadable()]
    lacking = [v for v in views if step not in v.loadable()]
    where = ", ".join(f"rank {v.rank} on {v.node}" for v in holders)
    why = "; ".join(
        f"rank {v.rank} on {v.node} cannot: "
        + (
            ", ".join(v.checkpoints[step]) + " missing"
            if step in v.checkpoints
            else f"no such folder in {v.output_dir}"
        )
        for v in lacking
    )
    return f"{CHECKPOINT_PREFIX}{step} is complete for {where}, but {why}"


def agree_on_checkpoint(output_dir: str | os.PathLike, policy: str, deepspeed: bool) -> str | None:
    """Collective: every rank's view → one decision. Returns the checkpoint folder to resume from (None =
    start at step 1) on every rank, or raises :class:`InvalidFields` with the same reason on every rank."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    view = rank_view(output_dir, rank, world, deepspeed)
    views: list[RankView] = [view]
    if distributed and world > 1:
        gathered: list[RankView | None] = [None] * world
        dist.all_gather_object(gathered, view)
        views = [v for v in gathered if v is not None]
    decision = decide(views, policy)
    for note in decision.notes:
        _say(rank, f"warning: resume: {note}")
    if decision.notes or decision.stop:  # a mismatch: each rank's view, as every rank saw it
        for v in views:
            _say(rank, f"resume: rank {v.rank} on {v.node} can load {_steps(v.loadable())}")
    if decision.stop:
        if distributed and world > 1:
            # Every rank stops here, together: leave the group so that nothing at exit (DeepSpeed's or
            # Accelerate's clean-up) starts a collective that a rank already gone cannot join.
            dist.barrier()
            dist.destroy_process_group()
        raise InvalidFields([f"resume: {decision.stop}"])
    if rank == 0 and decision.step is not None:
        _say(rank, f"resume: all {len(views)} ranks resume from {CHECKPOINT_PREFIX}{decision.step}")
    if decision.step is None:
        return None
    return str(Path(output_dir) / f"{CHECKPOINT_PREFIX}{decision.step}")


def _steps(steps: set[int]) -> str:
    return ", ".join(f"{CHECKPOINT_PREFIX}{s}" for s in sorted(steps)) or "no checkpoint"


def _say(rank: int, message: str) -> None:
    print(f"[rank {rank}] {message}", file=sys.stderr, flush=True)
