"""GRPOTrainer: TRL's GRPO loop with an overridable reward hook and Atlas telemetry.

TRL's loop is used as is. Atlas hooks in at two points:

* rewards: TRL's ``_calculate_rewards`` is routed through :meth:`GRPOTrainer.compute_rewards`,
  which a subclass may override (the teacher trainer does);
* callbacks: rank 0 exports the ``atlas_training_*`` Prometheus gauges when
  ``args.metrics_port`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import trl
from accelerate.utils import gather

from atlas_core.models.tiny import resolve_model_path
from atlas_core.training.algorithms.grpo_config import GRPOConfig
from atlas_core.training.callbacks import telemetry_callbacks

RewardFunc = Callable[..., Sequence[float]] | str | torch.nn.Module


def _reward_column(name: str):
    """A subclass that overrides compute_rewards and passes no reward_funcs still needs one reward
    column for TRL to weight and log; this placeholder names it (it is never called)."""

    def column(*args, **kwargs):  # pragma: no cover - never called
        raise RuntimeError(
            "compute_rewards: this trainer has no reward_funcs; its compute_rewards override must not call "
            "super().compute_rewards()"
        )

    column.__name__ = name
    return column


class GRPOTrainer(trl.GRPOTrainer):
    """Group Relative Policy Optimization, as TRL implements it, with Atlas's hooks.

    Args:
        model: a ``PreTrainedModel``, or a Hugging Face id / local path (``builtin://tiny-llama`` builds the
            offline tiny model). ``None`` takes ``args.model_name_or_path``.
        reward_funcs: a reward function (``f(prompts, completions, **dataset_columns) -> list[float]``),
            a reward model id, an ``nn.Module``, or a list of them. Weighted by ``args.reward_weights``.
            May be omitted when a subclass overrides :meth:`compute_rewards`.
        args: :class:`~atlas_core.training.algorithms.grpo_config.GRPOConfig`.
        train_dataset, eval_dataset, processing_class, reward_processing_classes, callbacks, optimizers:
            as in ``trl.GRPOTrainer``; any further keyword goes to it unchanged.

    After each reward computation ``current_rewards`` holds the combined reward of every
    completion of the generation batch (all processes); after each training step
    ``current_kl`` holds its mean KL (empty when ``beta == 0``: KL is not computed then).
    """

    #: Name of the single reward column of a subclass that computes its reward itself (logs: rewards/<name>/mean).
    reward_column_name = "compute_rewards"

    def __init__(
        self,
        model: Any = None,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: GRPOConfig | trl.GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        **kwargs: Any,
    ):
        if model is None:
            model = getattr(args, "model_name_or_path", None)
            if model is None:
                raise ValueError("model: pass a model, or set GRPOConfig.model_name_or_path")
        if isinstance(model, str):
            model = resolve_model_path(model)
            if _looks_like_path(model) and not os.path.isdir(model):
                raise ValueError(f"model: '{model}' is not a directory with a saved model")
            if args is not None and getattr(args, "model_name_or_path", None) is None:
                args.model_name_or_path = model

        if reward_funcs is None or (isinstance(reward_funcs, list) and not reward_funcs):
            if type(self).compute_rewards is GRPOTrainer.compute_rewards:
                raise ValueError(
                    "reward_funcs: expected at least one reward function (or a subclass overriding compute_rewards)"
                )
            reward_funcs = [_reward_column(self.reward_column_name)]

        callbacks = [*(callbacks or []), *telemetry_callbacks(args)]

        self._reward_batch: tuple[list, list] | None = None
        self.current_rewards = torch.empty(0)
        self.current_kl = torch.empty(0)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            **kwargs,
        )

    # ------------------------------------------------------------------ rewards

    def compute_rewards(self, completions: list, prompts: list, **reward_kwargs: Any):
        """Rewards of this process's completions.

        Returns either a ``(len(completions), len(reward_funcs))`` tensor — one column per
        reward function, which TRL then weights by ``args.reward_weights``, sums, and logs
        per function — or, from an override, one combined reward per completion (a 1-D
        tensor or list), used as is. ``reward_kwargs`` are the dataset's extra columns
        (e.g. ``ground_truth``), one value per completion.

        The default runs ``reward_funcs`` exactly as ``trl.GRPOTrainer`` does.
        """
        if self._reward_batch is not None:
            inputs, completion_ids = self._reward_batch
        else:  # called directly, outside the training loop
            inputs = [{"prompt": p, **{k: v[i] for k, v in reward_kwargs.items()}} for i, p in enumerate(prompts)]
            completion_ids = [self.processing_class(text=str(c))["input_ids"] for c in completions]
        # TRL's implementation gathers across processes; keep this process's rows.
        everyone = super()._calculate_rewards(inputs, prompts, completions, completion_ids)
        start = self.accelerator.process_index * len(prompts) if self._reward_batch is not None else 0
        return everyone[start : start + len(prompts)]

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        skip = ("prompt", "completion", "completion_ids")
        reward_kwargs = {key: [row[key] for row in inputs] for key in inputs[0] if key not in skip}
        self._reward_batch = (inputs, completion_ids_list)
        try:
            local = self.compute_rewards(completions, prompts, **reward_kwargs)
        finally:
            self._reward_batch = None
        rewards_per_func = gather(self._as_reward_matrix(local, len(prompts)))
        weights = self.reward_weights.to(rewards_per_func.device)
        self.current_rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1).detach().cpu()
        return rewards_per_func

    def _as_reward_matrix(self, rewards, n: int) -> torch.Tensor:
        """Shape compute_rewards' result as the (n, len(reward_funcs)) matrix TRL weights and sums."""
        device = self.accelerator.device
        values = torch.as_tensor(rewards, dtype=torch.float32).to(device)
        num_funcs = len(self.reward_funcs)
        if values.dim() == 2 and tuple(values.shape) == (n, num_funcs):
            return values
        if values.dim() == 1 and values.shape[0] == n:
            # A combined reward: put it in the first column with a non-zero weight, scaled so that TRL's
            # weighted sum gives back exactly these values; other columns NaN (ignored by nansum).
            nonzero = torch.nonzero(self.reward_weights).flatten()
            if nonzero.numel() == 0:
                raise ValueError("reward_weights: every weight is 0, so no reward can reach the policy")
            column = int(nonzero[0])
            matrix = torch.full((n, num_funcs), float("nan"), device=device)
            matrix[:, column] = values / self.reward_weights[column].item()
            return matrix
        raise ValueError(
            f"compute_rewards: expected {n} rewards or a ({n}, {num_funcs}) tensor, got shape {tuple(values.shape)}"
        )

    # ------------------------------------------------------------------ telemetry

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        kl = self._metrics["train"].get("kl")
        self.current_kl = torch.tensor(kl[-1:], dtype=torch.float32) if kl else torch.empty(0)
        return loss


def _looks_like_path(model: str) -> bool:
    """A local path rather than a hub id: absolute, relative with ./ or ~, or existing on disk."""
    return model.startswith(("/", "./", "../", "~")) or os.path.exists(model)
