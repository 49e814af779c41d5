"""The one place Atlas touches TRL's private ``GRPOTrainer`` API, fenced: checked when imported, so that a TRL upgrade
that renames or reshapes a hooked method fails at once, naming it, instead of a loop that silently skips our hook.

TRL 1.16 offers no public hook for rewards computed by the trainer itself, for generation, or for rewriting a batch's
prompts before it is generated; Atlas overrides three private methods for that, here only, and hands each to a
public method of ours (``calculate_rewards_hook``, ``generate_hook``, ``generate_and_score_hook``) that subclasses
override instead. TRL's own behaviour stays reachable through ``trl_*`` methods, and its metrics through
``trl_metrics``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, cast

import trl

from atlas_core.training.fences import hook_problems

TESTED_TRL = "1.16.0"  # the release these signatures were read from (constraints.txt pins it)
# Hooked method → its parameters in the tested release.
HOOKED = {
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate": ("self", "prompts"),
    "_generate_and_score_completions": ("self", "inputs"),
}
METRICS_ATTRIBUTE = "self._metrics"  # {"train": defaultdict(list), "eval": defaultdict(list)}, set in __init__


def fence_problems(trainer_class: type[trl.GRPOTrainer] = trl.GRPOTrainer) -> list[str]:
    """What no longer matches in ``trainer_class`` (TRL's GRPOTrainer): each hooked method and the metrics dict."""
    problems = hook_problems(trainer_class, "GRPOTrainer", HOOKED)
    if METRICS_ATTRIBUTE not in inspect.getsource(trainer_class.__init__):
        problems.append(f"GRPOTrainer.__init__ no longer sets {METRICS_ATTRIBUTE}")
    return problems


def check_fence() -> None:
    problems = fence_problems()
    if problems:
        raise ImportError(
            f"atlas_core: TRL {trl.__version__} changed the private GRPOTrainer API Atlas hooks into (tested with "
            f"TRL {TESTED_TRL}): {'; '.join(problems)}. Install trl=={TESTED_TRL} (constraints.txt) or port "
            "atlas_core/training/algorithms/trl_hooks.py"
        )


check_fence()


class TRLHooks:
    """Mixin before ``trl.GRPOTrainer`` in a trainer's bases: TRL's private methods are overridden only here."""

    # ---- TRL's private methods, handed to our public hooks
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.calculate_rewards_hook(inputs, prompts, completions, completion_ids_list)

    def _generate(self, prompts: list):
        return self.generate_hook(prompts)

    def _generate_and_score_completions(self, inputs):
        return self.generate_and_score_hook(inputs)

    # ---- the public hooks (override these): TRL's behaviour by default
    def calculate_rewards_hook(self, inputs, prompts, completions, completion_ids_list):
        return self.trl_calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def generate_hook(self, prompts: list):
        return self.trl_generate(prompts)

    def generate_and_score_hook(self, inputs):
        return self.trl_generate_and_score(inputs)

    # ---- TRL's own implementations
    def trl_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return trl.GRPOTrainer._calculate_rewards(self, inputs, prompts, completions, completion_ids_list)

    def trl_generate(self, prompts: list):
        return trl.GRPOTrainer._generate(self._grpo_trainer(), prompts)

    def trl_generate_and_score(self, inputs):
        return trl.GRPOTrainer._generate_and_score_completions(self, inputs)

    @property
    def trl_metrics(self) -> Mapping[str, Mapping[str, list[Any]]]:
        """TRL's per-mode metric lists ({"train": {...}, "eval": {...}}), read for KL and eval figures."""
        return self._grpo_trainer()._metrics

    def _grpo_trainer(self) -> trl.GRPOTrainer:
        """This trainer as TRL's: the mixin is always a base before ``trl.GRPOTrainer`` (see the class)."""
        return cast(trl.GRPOTrainer, self)
