"""A tiny Llama-style causal LM and byte-level BPE tokenizer, built locally.

Tests, the demo and laptop runs need a real model that loads through the same
``from_pretrained`` path as an 8B checkpoint, but nothing may come from a model hub.
``build_tiny_model()`` trains a small byte-level BPE on text shaped like the bundled
tasks, wraps it with a ChatML chat template, initialises a small ``LlamaForCausalLM``
and saves both with ``save_pretrained`` into a cache directory keyed by the spec, so a
second call (or a second process) reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atlas_contract.checks import SMOLLM2_MODEL_URI, TINY_MODEL_URI, model_problems, model_reference
from atlas_core.models.cache import build_once, default_cache_dir

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model. Every field changes the cache key."""

    vocab_size: int = 512
    """BPE vocabulary size, special tokens included."""
    hidden_size: int = 64
    """Width of the residual stream."""
    intermediate_size: int = 192
    """Width of the MLP."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Attention heads (key/value heads equal, no GQA)."""
    max_position_embeddings: int = 512
    """Longest sequence the model accepts."""
    seed: int = 0
    """Seed for the weight initialisation."""

    def cache_key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _tokenizer_corpus() -> list[str]:
    """Text the BPE learns its merges from: the shapes of the bundled tasks, in ChatML."""
    from atlas_core.tasks.arithmetic import make_arithmetic_dataset, solution_text

    lines = []
    for row in make_arithmetic_dataset(400, seed=1234):
        lines.append(f"user\n{row['prompt'][0]['content']}\nassistant\n{solution_text(row)}")
    lines += [
        "<thinking>The student adds the numbers step by step.</thinking>",
        "<teaching>Line up the digits, add the ones, then carry to the tens.</teaching>",
        "<solution>42</solution> The answer is \\boxed{42}.",
        "Explain your approach briefly before answering. Check the result.",
    ]
    return lines


def _build_tokenizer(spec: TinyModelSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.model_max_length = spec.max_position_embeddings
    return fast


def _build_model(spec: TinyModelSpec, tokenizer):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def build_tiny_model(cache_dir: str | os.PathLike | None = None, spec: TinyModelSpec | None = None) -> Path:
    """Build (or reuse) the tiny model and tokenizer; returns the directory to ``from_pretrained``.

    The directory is written under a temporary name and renamed into place, so concurrent
    callers (several ranks of one run) never see a half-written model.
    """
    spec = spec or TinyModelSpec()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def write(staging: Path) -> None:
        tokenizer = _build_tokenizer(spec)
        model = _build_model(spec, tokenizer)
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        (staging / "atlas_tiny_spec.json").write_text(json.dumps(asdict(spec), indent=2))

    return build_once(root / f"tiny-llama-{spec.cache_key()}", write)


def resolve_model_path(model: str, cache_dir: str | os.PathLike | None = None, field: str = "model") -> str:
    """The folder ``from_pretrained`` loads for a model reference (atlas_contract/sources.py):

    - a builtin (``builtin://tiny-llama``, ``builtin://smollm2-135m-instruct``): its built folder;
    - ``s3://…`` or ``hf://…``: its fetched copy in ``$ATLAS_SOURCES_DIR`` (the pods', where the initializer fetched
      it), else in ``$ATLAS_CACHE_DIR/sources``; fetched first when it is not whole there (``atlas eval --teacher
      s3://…``), once;
    - a bare hub id ``org/name``: its fetched copy when ``$ATLAS_SOURCES_DIR`` is set (a pod) or a whole copy is in
      the cache already; otherwise the id as it is, for transformers' own hub cache (``~/.cache/huggingface``,
      ``HF_HUB_OFFLINE``), as before;
    - ``pvc://claim/path``: the claim's mount (``/mnt/atlas-pvc/<claim>/<path>`` in the pods); ValueError naming
      ``field`` where it is not mounted;
    - anything else (a path, an endpoint) unchanged.

    A source that cannot be fetched raises :class:`atlas_core.sources.errors.SourceError`."""
    if model == TINY_MODEL_URI:
        return str(build_tiny_model(cache_dir))
    if model == SMOLLM2_MODEL_URI:
        from atlas_core.models.smollm2 import build_smollm2

        return str(build_smollm2(cache_dir))
    if not isinstance(model, str) or model.startswith(("builtin://", "http://", "https://")):
        return model
    from atlas_contract.sources import ENV_SOURCES_DIR, parse
    from atlas_core.sources import local_copy, mounted_path

    try:
        location = parse(model)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
    if location.scheme == "pvc":
        return mounted_path(model, field, "the model's folder")
    if location.scheme != "hf" and location.scheme != "s3":
        return model
    folder = local_copy(model)
    assert folder is not None  # a fetched scheme always has a copy's folder
    from atlas_core.sources.manifest import is_complete

    bare_hub_id = location.scheme == "hf" and not model.startswith("hf://")
    if is_complete(folder, source=model):
        return folder
    if bare_hub_id and not os.environ.get(ENV_SOURCES_DIR):
        return model  # transformers' own hub cache, as a bare id always loaded
    from atlas_core.sources.fetch import fetch

    fetch(model, folder)
    return folder


def policy_model(model: Any, args: Any, config_name: str) -> Any:
    """The ``model`` a trainer was given, else its config's ``model_name_or_path``; a name is resolved
    (``builtin://`` built, a local folder checked by the contract's model-reference rule)."""
    if model is None:
        model = getattr(args, "model_name_or_path", None)
        if model is None:
            raise ValueError(f"model: pass a model, or set {config_name}.model_name_or_path")
    if isinstance(model, str):
        model = resolve_model_path(model)
        problems = model_problems(model, "model") if model_reference(model) == "path" else []
        if problems:
            raise ValueError(problems[0])
    return model
