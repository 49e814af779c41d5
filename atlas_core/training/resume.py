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

import json
import os
import socket
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from atlas_contract.errors import InvalidFields
from atlas_contract.names import CHECKPOINT_PREFIX, ENV_RUN_UID, RUN_IDENTITY_FILE, RUN_LOCK_FILE

# The files that hold a saved model's weights (one of them; a checkpoint without DeepSpeed, a final model).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")


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
    # step → why this run must not resume that checkpoint (another run wrote it, or other settings)
    foreign: dict[int, str] = field(default_factory=dict)
    lock_problem: str | None = None  # rank 0: another process holds the output folder

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
    """The files rank ``rank`` reads to resume from ``checkpoint`` that are missing or do not load (paths
    relative to it, with the reason when a file is there but broken: a kill while saving truncates)."""
    problems = []
    state = _state_problem(checkpoint / "trainer_state.json")  # every rank reads the global step from it
    if state:
        problems.append(state)
    rng = f"rng_state_{rank}.pth" if world_size > 1 else "rng_state.pth"
    problems += _need(checkpoint, [rng])
    if deepspeed:
        step = checkpoint.name.removeprefix(CHECKPOINT_PREFIX)
        problems += _need(checkpoint, ["latest"])  # DeepSpeed's pointer to global_step<N>
        shard_dir = checkpoint / f"global_step{step}"
        shards = sorted(shard_dir.glob(f"*zero_pp_rank_{rank}_*optim_states.pt"))
        if not shards:
            problems.append(f"global_step{step}/*zero_pp_rank_{rank}_*optim_states.pt (this rank's ZeRO shard)")
        problems += [p for shard in shards if (p := _file_problem(shard, checkpoint))]
        own = f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_model_states.pt"  # ZeRO-3
        shared = f"global_step{step}/mp_rank_00_model_states.pt"  # ZeRO-1/2
        problems += _need(checkpoint, [own if (checkpoint / own).exists() else shared])
    else:
        present = [name for name in WEIGHT_FILES if (checkpoint / name).exists()]
        problems += _need(checkpoint, present[:1] or ["model.safetensors"])
        problems += _need(checkpoint, ["optimizer.pt"])
    return problems


def _need(checkpoint: Path, names: list[str]) -> list[str]:
    problems = []
    for name in names:
        path = checkpoint / name
        problem = _file_problem(path, checkpoint) if path.is_file() else name
        if problem:
            problems.append(problem)
    return problems


def _file_problem(path: Path, checkpoint: Path) -> str | None:
    """None when ``path`` can be read as what it claims to be (cheaply: headers and indexes, not all data)."""
    name = path.relative_to(checkpoint).as_posix()
    try:
        if path.suffix in (".pt", ".pth", ".bin"):  # torch.save: a zip whose index sits at the end
            with zipfile.ZipFile(path) as archive:
                archive.namelist()
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as tensors:
                tensors.keys()
        elif path.stat().st_size == 0:
            return f"{name} (empty)"
    except Exception as exc:  # noqa: BLE001 - any failure to read means "does not load"
        return f"{name} (does not load: {type(exc).__name__})"
    return None


def _state_problem(path: Path) -> str | None:
    if not path.is_file():
        return "trainer_state.json"
    try:
        state = json.loads(path.read_text())
        int(state["global_step"])
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return f"trainer_state.json (does not load: {type(exc).__name__})"
    return None


def node_name() -> str:
    """How a log names this rank's node: its host (the pod's name) and node rank when launched on several."""
    node_rank = os.environ.get("PET_NODE_RANK") or os.environ.get("GROUP_RANK")
    host = socket.gethostname()
    return f"{host} (node {node_rank})" if node_rank is not None else host


def rank_view(
    output_dir: str | os.PathLike, rank: int, world_size: int, deepspeed: bool, identity: dict | None = None
) -> RankView:
    root = Path(output_dir)
    view = RankView(rank=rank, node=node_name(), output_dir=str(root))
    for step in checkpoint_steps(root):
        checkpoint = root / f"{CHECKPOINT_PREFIX}{step}"
        view.checkpoints[step] = missing_files(checkpoint, rank, world_size, deepspeed)
        problem = identity_problem(checkpoint, identity) if identity else None
        if problem:
            view.foreign[step] = problem
    return view


def decide(views: list[RankView], policy: str) -> Decision:
    """The same decision on every rank, from every rank's view."""
    views = sorted(views, key=lambda v: v.rank)
    lock = next((v.lock_problem for v in views if v.lock_problem), None)
    if lock or policy == "never":
        return Decision(None, stop=lock)
    common = set.intersection(*(v.loadable() for v in views)) if views else set()
    newest_any = max((s for v in views for s in v.loadable()), default=None)
    step = max(common) if common else None
    notes = [_skipped(views, s) for s in sorted({s for v in views for s in v.checkpoints}) if s > (step or -1)]
    if step is not None:
        foreign = next((v.foreign[step] for v in views if step in v.foreign), None)
        if foreign:
            return Decision(None, stop=foreign, notes=notes)
        if notes:
            notes.append(f"every rank resumes from {CHECKPOINT_PREFIX}{step}, the newest checkpoint all ranks can load")
        return Decision(step, notes=notes)
    if newest_any is None:
        return Decision(None, notes=notes)  # nothing loadable anywhere: a fresh start
    if policy == "start_over":
        notes.append(
            f"resume: start_over: no checkpoint every rank can load, so EVERY RANK STARTS OVER AT STEP 1 "
            f"(the checkpoints in {views[0].output_dir} are kept and overwritten as training saves new ones)"
        )
        return Decision(None, notes=notes)
    return Decision(
        None,
        stop=(
            f"{_skipped(views, newest_any)}. No checkpoint is loadable by every rank, so no rank trains (resuming "
            "at different steps would run mismatched collectives). The output folder must be storage every node "
            "shares: set spec.checkpoint.pvc to a ReadWriteMany PersistentVolumeClaim (locally: one output_dir "
            "every process sees), or set resume: start_over in the run configuration to start over on every rank"
        ),
        notes=notes,
    )


def _skipped(views: list[RankView], step: int) -> str:
    """Why checkpoint ``step`` is not resumed from: which ranks can load it, which cannot and why."""
    holders = [v for v in views if step in v.loadable()]
    lacking = [v for v in views if step not in v.loadable()]
    why = "; ".join(
        f"rank {v.rank} on {v.node}: "
        + (", ".join(v.checkpoints[step]) + " missing or broken" if step in v.checkpoints else "no such folder")
        for v in lacking
    )
    if not holders:
        return f"skipped {CHECKPOINT_PREFIX}{step}, which no rank can load ({why})"
    where = ", ".join(f"rank {v.rank} on {v.node}" for v in holders)
    return f"{CHECKPOINT_PREFIX}{step} is complete for {where}, but not for every rank ({why})"


@dataclass
class Agreement:
    """What every rank agreed on: the checkpoint to resume from (None = step 1) and, on rank 0, the lock
    that keeps other runs out of the output folder until :meth:`release`."""

    checkpoint: str | None
    step: int | None
    lock: OutputLock | None = None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def agree_on_checkpoint(
    output_dir: str | os.PathLike, policy: str, deepspeed: bool, identity: dict | None = None
) -> Agreement:
    """Collective: every rank's view → one decision, on every rank. Rank 0 first takes the output folder's
    lock. Raises :class:`InvalidFields` with the same reason on every rank when the job must not train."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    lock = OutputLock(output_dir) if rank == 0 else None
    view = rank_view(output_dir, rank, world, deepspeed, identity)
    view.lock_problem = lock.acquire() if lock else None
    views: list[RankView] = [view]
    if distributed and world > 1:
        gathered: list[RankView | None] = [None] * world
        dist.all_gather_object(gathered, view)
        views = [v for v in gathered if v is not None]
    decision = decide(views, policy)
    for note in decision.notes:
        _say(rank, f"warning: resume: {note}")
    if decision.notes or (decision.stop and not view.lock_problem):  # a mismatch: each rank's view
        for v in views:
            _say(rank, f"resume: rank {v.rank} on {v.node} can load {_steps(v.loadable())}")
    if decision.stop:
        if lock is not None and not view.lock_problem:
            lock.release()
        if distributed and world > 1:
            # Every rank stops here, together: leave the group so that nothing at exit (DeepSpeed's or
            # Accelerate's clean-up) starts a collective that a rank already gone cannot join.
            dist.barrier()
            dist.destroy_process_group()
        raise InvalidFields([f"resume: {decision.stop}"])
    if rank == 0 and decision.step is not None:
        _say(rank, f"resume: all {len(views)} ranks resume from {CHECKPOINT_PREFIX}{decision.step}")
    checkpoint = None if decision.step is None else str(Path(output_dir) / f"{CHECKPOINT_PREFIX}{decision.step}")
    return Agreement(checkpoint, decision.step, lock)


# --------------------------------------------------------------------------- one run per output folder


class OutputLock:
    """An exclusive ``flock`` on ``<output_dir>/.atlas-run.lock``, held by rank 0 while the run trains. The
    kernel drops it when the process ends however it ends, so a killed run leaves no stale lock."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / RUN_LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> str | None:
        """None when this process now holds the folder; else why not (who holds it)."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held open for the run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            return (
                f"output_dir {self.path.parent} is in use by another run ({holder}); one run per output folder: "
                "wait for it to end, or give this run another output_dir"
            )
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        self._file = handle
        return None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None


# --------------------------------------------------------------------------- which run wrote a checkpoint

# Settings a checkpoint fixes: its optimizer state carries the learning rate and weight decay, its scheduler
# the schedule, its RNG state the seed, and its weights the model, data and rewards it was trained for. A
# resume with other values would silently keep the checkpoint's, so it is refused. Every other trainer
# field (batch sizes, GRPO and teaching settings, max_steps, logging, saving) is read each step and applies.
# ``lora``: a checkpoint of a LoRA run holds an adapter of that rank and those targets, and no full weights (and a
# full run's checkpoint no adapter), so its shape is fixed too.
IDENTITY_TRAINER_FIELDS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "seed", "lora")


def run_identity(run_name: str, settings: dict) -> dict:
    """Who is training: the run's name, its cluster uid ($ATLAS_RUN_UID, set by the operator) and the
    settings (``field: value``, JSON-safe) that a checkpoint must share to be resumed."""
    return {"run": run_name, "uid": os.environ.get(ENV_RUN_UID) or None, "settings": _json_safe(settings)}


def write_identity(checkpoint: str | os.PathLike, identity: dict) -> None:
    Path(checkpoint, RUN_IDENTITY_FILE).write_text(json.dumps(identity, indent=1, sort_keys=True))


def identity_problem(checkpoint: Path, identity: dict) -> str | None:
    """Why this run must not resume ``checkpoint`` (None: it may). Checkpoints that record no identity
    (written before Atlas recorded one) are resumed."""
    path = checkpoint / RUN_IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # an unreadable record is a broken checkpoint's business (its other files are checked)
    name = checkpoint.name
    if recorded.get("run") != identity["run"] or (
        recorded.get("uid") and identity["uid"] and recorded["uid"] != identity["uid"]
    ):
        return (
            f"{checkpoint.parent} holds {name} of another run ({recorded.get('run')!r}, uid {recorded.get('uid')}); "
            f"this run ({identity['run']!r}, uid {identity['uid']}) never resumes another run's checkpoints: delete "
            "that folder's checkpoints or give this run another output folder"
        )
    before, now = recorded.get("settings") or {}, identity["settings"]
    changed = [
        f"{k}: {before.get(k)!r} in {name}, {now.get(k)!r} now"
        for k in sorted(set(before) | set(now))
        if before.get(k) != now.get(k)
    ]
    if changed:
        return (
            f"{name} was trained with other settings ({'; '.join(changed)}). The checkpoint fixes these (its "
            "optimizer, schedule, RNG state and weights would silently keep the old values), so resuming is "
            "refused: restore them to continue, or start a new run (another output folder, or resume: never)"
        )
    return None


def _json_safe(value):
    return json.loads(json.dumps(value, default=lambda v: getattr(v, "value", str(v))))


def _steps(steps: set[int]) -> str:
    return ", ".join(f"{CHECKPOINT_PREFIX}{s}" for s in sorted(steps)) or "no checkpoint"


def _say(rank: int, message: str) -> None:
    print(f"[rank {rank}] {message}", file=sys.stderr, flush=True)
