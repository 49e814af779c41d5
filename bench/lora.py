"""LoRA against full fine-tuning, side by side in one run (python -m bench.lora).

For each model (``builtin://tiny-llama``; ``builtin://smollm2-135m-instruct``, skipped with a message without
``make real-model``) and each mode (full: every weight; LoRA: ``spec.training.lora``'s defaults, r 16, alpha 32,
dropout 0.05, all-linear), the same GRPO run on the same data and seed (the tiny recipe, builtin://arithmetic,
STEPS steps, one process), each in a process of its own, measured:

- step time: the median of the logged ``step_time`` of the steps after the first (the first loads and warms up);
- peak RSS of the training process (``wait4``'s ``ru_maxrss``);
- trainable parameters (what the optimizer updates) against the model's;
- the checkpoint's size on disk (weights or adapter, the optimizer's state, the rest), and the final model's;
- per vLLM weight sync: the bytes TRL 1.16 sends to a rollout server (the adapter merged into the base weights, then
  every weight: ``VLLMGeneration`` skips the LoRA layers, nothing sends an adapter) against the bytes of the adapter
  alone, which a server could load instead (vLLM's ``--enable-lora`` and ``/v1/load_lora_adapter``; not wired by
  TRL's weight sync).

One process on CPU: what LoRA saves on the optimizer and the checkpoint shows as on a GPU; step time on CPU is
dominated by generation (the same in both modes). About 2 minutes with SmolLM2 on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = 5
MODELS = ("builtin://tiny-llama", "builtin://smollm2-135m-instruct")
MODES = ("full", "lora")


def commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def overrides(model: str, mode: str, out: Path, steps: int) -> list[str]:
    run = [
        "recipe=tiny_grpo",
        f"model={model}",
        f"output_dir={out}",
        "dataset.num_samples=256",
        f"trainer.max_steps={steps}",
        f"trainer.save_steps={steps}",
        "trainer.per_device_train_batch_size=8",
        "trainer.max_completion_length=16",
        "trainer.metrics_port=0",
    ]
    return [*run, "+trainer.lora={}"] if mode == "lora" else run


def train(model: str, mode: str, out: Path, steps: int) -> dict:
    """One run in its own process; its step times and peak RSS."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "atlas_core.cli.train", *overrides(model, mode, out, steps)]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench.lora: {mode} run of {model} failed:\n{stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in records if "step_time" in r and r.get("step", 0) > 1]
    return {"step_time_s": statistics.median(times), "peak_rss_mib": usage.ru_maxrss / 1024}


def folder_mib(folder: Path, names: tuple[str, ...] | None = None) -> float:
    files = [p for p in folder.iterdir() if p.is_file() and (names is None or p.name in names)]
    return sum(p.stat().st_size for p in files) / 2**20


def parameters(model: str, out: Path, mode: str) -> dict:
    """Trainable and total parameters, and the bytes of one weight sync against the adapter alone."""
    from transformers import AutoModelForCausalLM

    from atlas_core.models.tiny import resolve_model_path

    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(model))
    total = sum(p.numel() for p in base.parameters())
    synced = sum(p.numel() * p.element_size() for p in base.parameters())  # every weight, merged, per sync
    if mode == "full":
        return {"trainable": total, "total": total, "sync_mib": synced / 2**20, "adapter_mib": None}
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(base, str(out))
    trainable = sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n)
    adapter = sum(p.numel() * p.element_size() for n, p in adapted.named_parameters() if "lora_" in n)
    return {"trainable": trainable, "total": total, "sync_mib": synced / 2**20, "adapter_mib": adapter / 2**20}


def measure(model: str, mode: str, root: Path, steps: int) -> dict:
    out = root / f"{model.removeprefix('builtin://')}-{mode}"
    result = {"model": model, "mode": mode, **train(model, mode, out, steps), **parameters(model, out, mode)}
    checkpoint = out / f"checkpoint-{steps}"
    result["checkpoint_mib"] = folder_mib(checkpoint)
    result["optimizer_mib"] = folder_mib(checkpoint, ("optimizer.pt",))
    result["final_model_mib"] = folder_mib(out, ("model.safetensors", "adapter_model.safetensors"))
    return result


def missing(model: str) -> str | None:
    """Why ``model`` cannot be built here (None: it can)."""
    if model != "builtin://smollm2-135m-instruct":
        return None
    from atlas_core.models.smollm2 import RealModelMissing, gguf_path

    try:
        gguf_path()
    except RealModelMissing as exc:
        return str(exc)
    return None


def table(results: list[dict]) -> str:
    rows = [
        "| model | mode | step time (s) | peak RSS (MiB) | trainable params | checkpoint (MiB) | of it optimizer "
        "| final model (MiB) | per vLLM sync (MiB) | adapter alone (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        share = f"{r['trainable']:,} ({100 * r['trainable'] / r['total']:.2f}%)"
        adapter = "—" if r["adapter_mib"] is None else f"{r['adapter_mib']:.2f}"
        rows.append(
            f"| {r['model'].removeprefix('builtin://')} | {r['mode']} | {r['step_time_s']:.2f} | "
            f"{r['peak_rss_mib']:.0f} | {share} | {r['checkpoint_mib']:.2f} | {r['optimizer_mib']:.2f} | "
            f"{r['final_model_mib']:.2f} | {r['sync_mib']:.2f} | {adapter} |"
        )
    return "\n".join(rows)


def ratios(results: list[dict]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        full, lora = (next(r for r in results if r["model"] == model and r["mode"] == m) for m in MODES)
        lines.append(
            f"{model.removeprefix('builtin://')}: LoRA/full step time "
            f"{lora['step_time_s'] / full['step_time_s']:.2f}x, "
            f"peak RSS {lora['peak_rss_mib'] / full['peak_rss_mib']:.2f}x, checkpoint "
            f"{lora['checkpoint_mib'] / full['checkpoint_mib']:.3f}x, trainable "
            f"{lora['trainable'] / full['trainable']:.4f}x; the adapter alone would be "
            f"{lora['adapter_mib'] / lora['sync_mib']:.3f}x of each sync's bytes"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="atlas-bench-lora-") as root:
        for model in MODELS:
            reason = missing(model)
            if reason:
                print(f"bench.lora: {model} skipped: {reason}", flush=True)
                continue
            for mode in MODES:
                print(f"bench.lora: {model}, {mode} …", flush=True)
                results.append(measure(model, mode, Path(root), args.steps))
    print(f"\nbench.lora at {commit()}, {args.steps} GRPO steps, one process, {os.cpu_count()} CPUs\n")
    print(table(results))
    print()
    print("\n".join(ratios(results)))
    if args.json:
        args.json.write_text(json.dumps({"commit": commit(), "steps": args.steps, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
