"""LoRA in the trainers: a config's ``lora`` settings (atlas_contract/lora.py) as PEFT's ``LoraConfig``, handed to
TRL as its own ``peft_config`` (TRL wraps the policy with ``get_peft_model``, computes the KL's reference with the
adapter disabled, merges the adapter for each vLLM weight sync and unmerges it; the Trainer saves and resumes the
adapter). What TRL does not check, this module does before the model is loaded: that every ``target_modules`` entry
names a module of the model (with the model's candidates in the message), and that a quantised checkpoint is not
asked for what needs a merge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME

from atlas_contract.lora import ALL_LINEAR, LoraSettings

# The module kinds PEFT's LoRA adapts (peft/tuners/lora/layer.py dispatch): what a target may name.
_ADAPTABLE = ("Linear", "Conv1D", "Conv1d", "Conv2d", "Conv3d", "Embedding")


def lora_settings(args: Any) -> LoraSettings | None:
    """The LoRA settings of a trainer config (``args.lora``, already checked by the config), or None."""
    raw = getattr(args, "lora", None)
    settings, problems = LoraSettings.parse(raw, "lora")
    if problems:
        raise ValueError("; ".join(problems))
    return settings


def peft_config(settings: LoraSettings):
    """PEFT's ``LoraConfig`` for a causal LM with ``settings``."""
    from peft import LoraConfig

    targets = settings.target_modules
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,  # type: ignore[arg-type]  # annotated int in PEFT, which divides it by r
        lora_dropout=settings.dropout,
        target_modules=targets if targets == ALL_LINEAR else list(targets),
        task_type="CAUSAL_LM",
    )


def trainer_peft_config(args: Any, given: Any, model: Any) -> Any:
    """The ``peft_config`` a trainer hands TRL: the caller's own (TRL's keyword), else one from ``args.lora`` —
    checked against ``model`` (a loaded model or the folder/id it is loaded from) before any weight is loaded."""
    settings = lora_settings(args)
    if given is not None and settings is not None:
        raise ValueError("peft_config: pass either peft_config or the config's lora settings, not both")
    if given is not None or settings is None:
        return given
    problems = target_problems(model, settings, trust_remote_code=bool(getattr(args, "trust_remote_code", False)))
    quantised = quantisation(model)
    if quantised and getattr(args, "use_vllm", False):
        problems.append(
            f"lora: the model is quantised ({quantised}); vLLM's weight sync merges the adapter into the base weights "
            "after every step, which a quantised checkpoint cannot take exactly: use the trainer's own generation "
            "(use_vllm false, spec.rollout.replicas 0) or an unquantised checkpoint"
        )
    if problems:
        raise ValueError("; ".join(problems))
    return peft_config(settings)


def module_names(model: Any, trust_remote_code: bool = False) -> list[str]:
    """Every adaptable module's qualified name; a model not yet loaded is built on the meta device from its config
    (no weight is read)."""
    import torch

    if isinstance(model, torch.nn.Module):
        modules = model.named_modules()
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(model), trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        modules = skeleton.named_modules()
    return [name for name, module in modules if name and type(module).__name__ in _ADAPTABLE]


def target_problems(model: Any, settings: LoraSettings, trust_remote_code: bool = False) -> list[str]:
    """Each ``target_modules`` entry that matches no adaptable module of ``model`` (PEFT's rule for a list: the name
    itself or a ``.<entry>`` suffix), naming the model's candidates."""
    if settings.target_modules == ALL_LINEAR:
        return []
    names = module_names(model, trust_remote_code)
    unmatched = [t for t in settings.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if not unmatched:
        return []
    candidates = sorted({name.rsplit(".", 1)[-1] for name in names})
    shown = getattr(model, "name_or_path", model)
    return [
        f"lora.target_modules: {', '.join(repr(t) for t in unmatched)} matches no module of the model {shown!r} "
        f"(its candidates: {', '.join(candidates)}; or '{ALL_LINEAR}')"
    ]


def quantisation(model: Any) -> str | None:
    """The quantisation method of a model or checkpoint folder (its config's ``quantization_config``), or None."""
    config = getattr(model, "config", None)
    if config is not None:
        found = getattr(config, "quantization_config", None)
    else:
        path = Path(str(model)) / "config.json"
        found = json.loads(path.read_text()).get("quantization_config") if path.is_file() else None
    if not found:
        return None
    method = found.get("quant_method") if isinstance(found, dict) else getattr(found, "quant_method", None)
    return str(getattr(method, "value", method) or "quantization_config")


def merge_problem(model: str) -> str | None:
    """Why the adapter of a run on ``model`` (a folder) cannot be merged for ``output.merge``, or None."""
    quantised = quantisation(model)
    if not quantised:
        return None
    return (
        f"output.merge: the model is quantised ({quantised}): a LoRA adapter cannot be merged into it exactly; "
        "export the adapter alone (merge false) or train on an unquantised checkpoint"
    )


def name_adapter_base(folder: str | Path, reference: str) -> bool:
    """Write the run's model reference (``builtin://…``, ``s3://…``, a hub id) as the base of the adapter saved in
    ``folder``, instead of the local copy it was loaded from, so that the adapter names a base that outlives this pod
    (atlas_core/models/loading.py resolves it). Done on the saved file, not the model: PEFT looks a base it cannot
    find locally up on the hub at every save. The file is replaced whole. False when ``folder`` holds no adapter."""
    from atlas_core.models.loading import ADAPTER_CONFIG, is_adapter
    from atlas_core.sources.manifest import write_atomically

    if not is_adapter(folder):
        return False
    path = Path(folder) / ADAPTER_CONFIG
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = reference
    write_atomically(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return True


def adapter_fingerprint(tensors: dict[str, Any]) -> str:
    """sha256 over an adapter's tensors (name and float32 values, in name order): the same for the adapter a model
    holds and for the ``adapter_model.safetensors`` it was saved to or loaded from."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


class ResumedAdapterCheck(TrainerCallback):
    """A TrainerCallback for a LoRA run resumed from ``checkpoint``: once the Trainer has loaded it (at
    ``on_train_begin``), the policy must hold exactly one adapter and its weights must be the checkpoint's (a resume
    that wrapped the model in a second adapter, or left a fresh one, would train on silently: ms-swift #8233). Rank 0
    says so with the adapter's fingerprint; a mismatch stops every rank, naming the checkpoint."""

    def __init__(self, checkpoint: str):
        self.checkpoint = Path(checkpoint)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from peft import get_peft_model_state_dict
        from safetensors.torch import load_file

        adapters = list(getattr(model, "peft_config", None) or {})
        with _gathered(model):
            held = get_peft_model_state_dict(model)
        saved = load_file(self.checkpoint / ADAPTER_SAFE_WEIGHTS_NAME)
        problems = []
        if len(adapters) != 1 or any(".base_layer.base_layer." in name for name, _ in model.named_modules()):
            problems.append(f"the policy holds adapters {adapters} (one expected)")
        mine = adapter_fingerprint(held)
        if held.keys() != saved.keys():
            problems.append(f"{len(held)} adapter tensors in the policy, {len(saved)} in the checkpoint")
        elif mine != adapter_fingerprint(saved):
            problems.append(f"the policy's adapter (sha256 {mine[:16]}) is not the checkpoint's")
        if problems:
            raise RuntimeError(f"resume: {self.checkpoint.name}'s LoRA adapter not applied once: {'; '.join(problems)}")
        if state.is_world_process_zero:
            print(
                f"resume: the LoRA adapter of {self.checkpoint.name} applied once: {len(held)} tensors, sha256 {mine}",
                flush=True,
            )


def _gathered(model: Any):
    """The adapter's parameters whole for a moment under ZeRO-3 (partitioned otherwise; the base's stay so), else
    nothing to do."""
    import contextlib

    partitioned = [p for name, p in model.named_parameters() if "lora_" in name and hasattr(p, "ds_id")]
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)
