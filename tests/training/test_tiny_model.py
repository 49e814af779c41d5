import os
import subprocess

from harness.env import PYTHON, python_env


def test_builds_offline_and_loads_through_from_pretrained(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000

    # Byte-level BPE: any text round-trips, including characters never seen in training.
    text = "Grüße, 東京! \\boxed{42} <solution>7</solution>"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id

    ids = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_second_build_reuses_the_cache(tiny_model_dir):
    from atlas_core.models.tiny import TINY_MODEL_URI, build_tiny_model, resolve_model_path

    before = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model() == tiny_model_dir
    assert resolve_model_path(TINY_MODEL_URI) == str(tiny_model_dir)
    assert resolve_model_path("org/model") == "org/model"
    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_concurrent_builds_in_a_fresh_cache_agree(tmp_path):
    """Ranks of one run build at the same time: both must end with the same complete model."""
    code = "from atlas_core.models.tiny import build_tiny_model; print(build_tiny_model())"
    env = python_env(ATLAS_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    paths = {p.communicate(timeout=300)[0].strip().splitlines()[-1] for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    built = [d for d in tmp_path.iterdir() if not d.name.startswith(".")]
    assert len(built) == 1 and (built[0] / "config.json").exists()
