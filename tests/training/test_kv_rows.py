"""atlas_core/teaching/kv_rows.py on the tiny Llama: rows that join a running batch, leave it, share a prompt
prefix and write each step in place decode as each row does alone (the real model's answers:
tests/training/test_real_model.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def alone(model, prompt, tokens):
    """Each next-token logits of ``prompt`` fed ``tokens`` one by one, the row decoded by itself."""
    out = []
    with torch.no_grad():
        ids = prompt[None, :]
        for token in [None, *tokens]:
            if token is not None:
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            out.append(model(input_ids=ids).logits[0, -1])
    return out


def test_rows_joining_leaving_and_sharing_a_prefix_decode_as_each_row_alone(model):
    from atlas_core.teaching import kv_rows

    assert kv_rows.joinable(model)
    shared = [5, 6, 7, 8, 9]
    prompts = [torch.tensor(shared + rest) for rest in ([10, 11, 12], [13], [14, 15, 16, 17, 18, 19], [20, 21])]
    assert kv_rows.shared_prefix_length(prompts) == len(shared)
    assert kv_rows.shared_prefix_length([torch.tensor(shared), torch.tensor(shared)]) == len(shared) - 1
    prefix = kv_rows.Prefix.of(model, prompts[0][: len(shared)])
    fed = {row: [30 + row, 40 + row, 50 + row, 60 + row, 70 + row] for row in range(4)}
    expected = {row: alone(model, prompts[row], fed[row]) for row in range(4)}
    seen = {row: [] for row in range(4)}

    def record(rows):
        for i, row in enumerate(rows.ids):
            seen[row].append(rows.logits[i])

    def feed(rows):
        tokens = torch.tensor([fed[row][len(seen[row]) - 1] for row in rows.ids])
        rows.step(model, tokens)
        record(rows)

    with torch.no_grad():
        running = kv_rows.prefill(model, prompts[:2], [0, 1], True, 0, prefix)  # rows 0 and 1, with the prefix
        record(running)
        feed(running)
        joined = kv_rows.prefill(model, prompts[2:], [2, 3], True, 0, None)  # rows 2 and 3 join, no prefix
        record(joined)
        running = running.join(joined)
        feed(running)
        running = running.select(torch.tensor([1, 2, 3]))  # row 0 leaves
        feed(running)
        width = running.mask.shape[1]
        running = running.select(torch.tensor([0, 2]))  # row 2 leaves: the padding only it needed goes too
        assert running.ids == [1, 3] and running.mask.shape[1] == width - 2
        feed(running)
        keys = running.cache.layers[0].keys
        feed(running)  # a step writes its token in place, after the filled part (kv_rows.RoomyLayer)
        assert running.cache.layers[0].keys.data_ptr() == keys.data_ptr()
        assert running.cache.layers[0].keys.shape[-2] == keys.shape[-2] + 1
    for row in range(4):
        assert len(seen[row]) >= 3
        for got, want in zip(seen[row], expected[row], strict=False):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_model_whose_cache_has_sliding_layers_is_not_joined(model):
    from transformers import MistralConfig, MistralForCausalLM

    from atlas_core.teaching import kv_rows

    config = MistralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=4,
    )
    assert not kv_rows.joinable(MistralForCausalLM(config))
