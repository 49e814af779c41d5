"""Loading a trained model for inference, whether its folder holds whole weights or a LoRA adapter.

A LoRA run's final model and its export are an adapter folder as PEFT writes it (``adapter_config.json``,
``adapter_model.safetensors``, the tokenizer): its ``base_model_name_or_path`` is the run's model reference
(``builtin://…``, ``s3://…``, a hub id: atlas_core/training/lora.py), resolved here like any model reference
(atlas_core/models/tiny.py ``resolve_model_path``: built, fetched once or read in place), the adapter applied with
PEFT's own ``PeftModel.from_pretrained`` and merged (inference needs no separate adapter layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` holds a PEFT adapter (not whole weights)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model reference an adapter folder names."""
    base = json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{folder}: {ADAPTER_CONFIG} names no base_model_name_or_path")
    return str(base)


def _base_folder(path: str) -> str:
    """The folder of an adapter's base, resolved as any model reference (built, fetched once, read in place)."""
    from atlas_core.models.tiny import resolve_model_path

    return resolve_model_path(adapter_base(path), field="adapter's base")


def load_causal_lm(path: str, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)``; an adapter folder's base loaded the same way (itself
    perhaps an adapter folder) and the adapter merged into it."""
    from transformers import AutoModelForCausalLM

    if not is_adapter(path):
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    from peft import PeftModel

    base = load_causal_lm(_base_folder(path), **kwargs)  # itself an adapter, perhaps (a LoRA warm-up, then GRPO)
    merged = PeftModel.from_pretrained(base, path).merge_and_unload()
    merged.name_or_path = str(path)
    return merged


def load_tokenizer(path: str):
    """The tokenizer saved with a model or adapter (a trainer saves it beside either), else the adapter's base's."""
    from transformers import AutoTokenizer

    folder = Path(path)
    saved = any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    if is_adapter(path) and not saved:
        return AutoTokenizer.from_pretrained(_base_folder(path))
    return AutoTokenizer.from_pretrained(path)


def merged_if_adapter(model: Any, args: Any = None) -> Any:
    """A trainer's model: a LoRA adapter's folder (another run's model, e.g. a LoRA warm-up's) loaded with its adapter
    merged, the weights this run trains on (with ``args.model_init_kwargs``); anything else unchanged."""
    if isinstance(model, str) and is_adapter(model):
        return load_causal_lm(model, **(getattr(args, "model_init_kwargs", None) or {}))
    return model
