"""Each private third-party API the project uses sits behind one fence that fails loudly, naming what changed, when
an upgrade moves it (atlas_operator/kopf_compat.py, atlas_core/training/algorithms/trl_hooks.py,
atlas_core/training/checkpoints.py)."""

from __future__ import annotations

import importlib

import kopf
import pytest
import trl


def test_the_trl_fence_passes_on_the_pinned_trl_and_names_a_changed_hook():
    from atlas_core.training.algorithms import trl_hooks
    from atlas_core.training.algorithms.grpo import GRPOTrainer

    assert trl.__version__ == trl_hooks.TESTED_TRL and trl_hooks.fence_problems() == []

    class Upgraded(trl.GRPOTrainer):  # what a TRL release that reshaped two hooks would look like
        def _generate(self, prompts, images):
            raise NotImplementedError

        _calculate_rewards = None

    problems = trl_hooks.fence_problems(Upgraded)
    assert "GRPOTrainer._generate takes (self, prompts, images), not (self, prompts)" in problems
    assert any(p.startswith("GRPOTrainer._calculate_rewards") for p in problems)
    # Our trainers override TRL's private methods only in the fenced mixin.
    for name in trl_hooks.HOOKED:
        owners = [cls for cls in GRPOTrainer.__mro__ if name in vars(cls)]
        assert owners[0] is trl_hooks.TRLHooks, (name, owners)


def test_the_transformers_fence_passes_on_the_pinned_release_and_names_a_changed_hook():
    import transformers

    from atlas_core.training import checkpoints
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.sft import SFTTrainer

    assert transformers.__version__ == checkpoints.TESTED_TRANSFORMERS and checkpoints.fence_problems() == []

    class Upgraded(transformers.Trainer):  # a release that saves elsewhere and renamed the output-folder helper
        def _save_checkpoint(self, model, trial, metrics=None):
            raise NotImplementedError

        _get_output_dir = None

    problems = checkpoints.fence_problems(Upgraded)
    assert "Trainer._save_checkpoint takes (self, model, trial, metrics), not (self, model, trial)" in problems
    assert "Trainer._save_checkpoint no longer calls self._get_output_dir(trial=trial)" in problems
    assert "Trainer._get_output_dir is gone" in problems
    # Both trainers write checkpoints through the fenced mixin, before TRL's and transformers' own.
    for trainer in (GRPOTrainer, SFTTrainer):
        for name in checkpoints.HOOKED:
            owners = [cls for cls in trainer.__mro__ if name in vars(cls)]
            assert owners[0] is checkpoints.AtomicCheckpoints, (trainer, name, owners)


def test_the_kopf_fence_refuses_another_minor_release(monkeypatch):
    from atlas_operator import kopf_compat

    assert kopf_compat.INSTALLED_KOPF == kopf_compat.TESTED_KOPF
    monkeypatch.setattr(kopf, "__version__", "1.46.0", raising=False)
    try:
        with pytest.raises(ImportError, match=r"kopf 1\.46\.0 is not the kopf .*\(tested with kopf 1\.45\.2\)"):
            importlib.reload(kopf_compat)
    finally:
        monkeypatch.undo()
        importlib.reload(kopf_compat)


def test_kopfs_watch_stream_decodes_with_orjson_and_reads_what_json_reads():
    """kopf_compat sets kopf's watch-stream decoder (its ``api`` module's ``json``) to orjson's: the same objects
    as the standard library's from an API server's watch line."""
    import json

    import orjson
    from atlas_operator import kopf_compat  # noqa: F401  (the fence sets the decoder when imported)
    from kopf._cogs.clients import api

    assert api.json.loads is orjson.loads
    line = json.dumps(
        {"type": "MODIFIED", "object": {"metadata": {"name": "r", "generation": 2**40}, "status": {"x": [1.5, None]}}}
    )
    assert api.json.loads(line) == json.loads(line)
