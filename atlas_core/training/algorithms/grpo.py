"""GRPOTrainer: TRL's GRPO loop with an overridable reward hook and Atlas telemetry.

TRL's loop is used as is. Atlas hooks in at two points (TRL's private methods only through the fenced mixin of
atlas_core/training/algorithms/trl_hooks.py):

* rewards: TRL's reward computation is routed through :meth:`GRPOTrainer.compute_rewards`,
  which a subclass may override (the teacher trainer does);
* callbacks: rank 0 exports the ``atlas_training_*`` Prometheus gauges when
  ``args.metrics_port`` is set.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
import trl
from accelerate.utils import gather, gather_object
from transformers import EvalPrediction, PreTrainedTokenizerBase, TrainerCallback

from atlas_core.activity import waiting_for
from atlas_core.answers import completion_text
from atlas_core.models.loading import merged_if_adapter
from atlas_core.models.tiny import policy_model, resolve_model_path
from atlas_core.training.algorithms.grpo_config import GRPOConfig
from atlas_core.training.algorithms.trl_hooks import TRLHooks
from atlas_core.training.callbacks import telemetry_callbacks
from atlas_core.training.checkpoints import AtomicCheckpoints
from atlas_core.training.lora import trainer_peft_config
from atlas_core.training.preemption import stop_callbacks
from atlas_core.training.watchdog import (
    rollout_server_url,
    server_check_timeout,
    wait_for_server,
    watchdog_callbacks,
)

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


class GRPOTrainer(AtomicCheckpoints, TRLHooks, trl.GRPOTrainer):
    """Group Relative Policy Optimization, as TRL implements it, with Atlas's hooks.

    Args:
        model: a ``PreTrainedModel``, or a Hugging Face id / local path (``builtin://tiny-llama`` builds the
            offline tiny model). ``None`` takes ``args.model_name_or_path``.
        reward_funcs: a reward function (``f(prompts, completions, **dataset_columns) -> list[float]``),
            a reward model id, an ``nn.Module``, or a list of them. Weighted by ``args.reward_weights``.
            May be omitted when a subclass overrides :meth:`compute_rewards`.
        args: :class:`~atlas_core.training.algorithms.grpo_config.GRPOConfig` (``config`` is the same).
        train_dataset, eval_dataset, processing_class, reward_processing_classes, callbacks, optimizers:
            as in ``trl.GRPOTrainer``; any further keyword goes to it unchanged.
        config: the trainers reference's name for ``args``.
        tokenizer: the trainers reference's name for ``processing_class``.
        ref_model: the reference model of the KL penalty (``beta > 0``) instead of a fresh copy of the policy.
        reward_model: a sequence-classification reward model (or its id), added to ``reward_funcs``.
        compute_metrics: ``f(EvalPrediction) -> dict`` run after evaluation on the generated completions
            (``predictions``, one text per completion) and the eval dataset's ``ground_truth`` (``label_ids``).
        peft_config: TRL's own: a ``peft.LoraConfig`` (or other PEFT config) to train an adapter of the policy;
            ``args.lora`` builds one from Atlas's settings (not both).
        accelerator: an ``accelerate.Accelerator`` the caller already made. The Trainer builds its own from
            ``args`` (they share Accelerate's process state); a mismatch in the distributed setup is an error.

    After each reward computation ``current_rewards`` holds the combined reward of every
    completion of the generation batch (all processes); after each training step
    ``current_kl`` holds its mean KL (0 when ``beta == 0``: there is no KL term then).

    A subclass may define Trainer-callback methods on itself (``on_epoch_begin``, ``on_step_end``,
    ``on_evaluate``, ``on_log``, ...): they are called at those events, with the callback arguments
    ``(args, state, control, **kwargs)`` or with none when the method takes none.
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
        *,
        config: GRPOConfig | None = None,
        tokenizer=None,
        ref_model=None,
        reward_model=None,
        compute_metrics: Callable[[EvalPrediction], dict] | None = None,
        accelerator=None,
        **kwargs: Any,
    ):
        args = _one_of("config", config, "args", args)
        processing_class = _one_of("tokenizer", tokenizer, "processing_class", processing_class)
        if reward_model is not None:
            reward_funcs = [*_as_list(reward_funcs), reward_model]
        if ref_model is not None and args is not None and args.beta == 0.0:
            raise ValueError("ref_model: the reference model is only used with a KL penalty (set beta > 0)")
        _prepare_args(args)
        model = merged_if_adapter(policy_model(model, args, "GRPOConfig"), args)  # a LoRA run's adapter: merged
        kwargs["peft_config"] = trainer_peft_config(args, kwargs.get("peft_config"), model)
        if isinstance(model, str):
            if args is not None and getattr(args, "model_name_or_path", None) is None:
                args.model_name_or_path = model  # type: ignore[union-attr]  # TRL's own GRPOConfig gets it too

        if reward_funcs is None or (isinstance(reward_funcs, list) and not reward_funcs):
            if type(self).compute_rewards is GRPOTrainer.compute_rewards:
                raise ValueError(
                    "reward_funcs: expected at least one reward function (or a subclass overriding compute_rewards)"
                )
            reward_funcs = [_reward_column(self.reward_column_name)]

        callbacks = [
            *(callbacks or []),
            *telemetry_callbacks(args),
            *watchdog_callbacks(args),
            *stop_callbacks(args),
            _SubclassHooks(self),
        ]

        self._reward_batch: tuple[list, list] | None = None
        self._eval_records: list[tuple[str, Any]] = []
        self.current_rewards = torch.empty(0)
        self.current_kl = torch.empty(0)
        super().__init__(
            model=model,
            # TRL's annotation is narrower than what it takes: any nn.Module, rewards as any sequence of floats
            reward_funcs=reward_funcs,  # type: ignore[arg-type]
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            **kwargs,
        )
        self.compute_metrics = compute_metrics
        if accelerator is not None:
            self._check_accelerator(accelerator)
        if ref_model is not None:
            self._use_ref_model(ref_model)

    def _check_accelerator(self, accelerator) -> None:
        ours = (self.accelerator.distributed_type, self.accelerator.num_processes)
        theirs = (accelerator.distributed_type, accelerator.num_processes)
        if ours != theirs:
            raise ValueError(
                f"accelerator: distributed type/processes {theirs} differ from the ones args set up {ours}; "
                "launch with `accelerate launch` and let the trainer build its Accelerator"
            )

    def _use_ref_model(self, ref_model) -> None:
        """Put the caller's reference model where TRL keeps its own, prepared the same way."""
        from trl.models.utils import prepare_deepspeed

        if isinstance(ref_model, str):
            from transformers import AutoModelForCausalLM

            ref_model = AutoModelForCausalLM.from_pretrained(resolve_model_path(ref_model))
        ref_model.requires_grad_(False)
        ref_model.eval()
        if self.is_deepspeed_enabled:
            self.ref_model = prepare_deepspeed(ref_model, self.accelerator)
        else:
            self.ref_model = self.accelerator.prepare_model(ref_model, evaluation_mode=True)

    # ------------------------------------------------------------------ rewards

    def compute_rewards(self, completions: list, prompts: list, **reward_kwargs: Any):
        """Rewards of this process's completions.

        Returns either a ``(len(completions), len(reward_funcs))`` tensor — one column per
        reward function, which TRL then weights by ``args.reward_weights``, sums, and logs
        per function — or, from an override, one combined reward per completion (a 1-D
        tensor or list), used as is. ``reward_kwargs`` are the dataset's extra columns
        (e.g. ``ground_truth``), one value per completion.

        The default runs ``reward_funcs`` exactly as ``trl.GRPOTrainer`` does, including its gather
        across processes: called outside the training loop in a multi-process run, every rank must
        call it (with its own, equally long batch).
        """
        if self._reward_batch is not None:
            inputs, completion_ids = self._reward_batch
        else:  # called directly, outside the training loop
            inputs = [{"prompt": p, **{k: v[i] for k, v in reward_kwargs.items()}} for i, p in enumerate(prompts)]
            tokenizer = cast(PreTrainedTokenizerBase, self.processing_class)  # a text model's: a tokenizer
            completion_ids = [tokenizer(text=str(c))["input_ids"] for c in completions]
        # TRL's implementation gathers across processes; keep this process's rows.
        everyone = self.trl_calculate_rewards(inputs, prompts, completions, completion_ids)
        start = self.accelerator.process_index * len(prompts)
        return everyone[start : start + len(prompts)]

    def calculate_rewards_hook(self, inputs, prompts, completions, completion_ids_list):
        with waiting_for(f"the reward functions ({', '.join(self.reward_func_names)})"):
            return self._rewards_of(inputs, prompts, completions, completion_ids_list)

    def _rewards_of(self, inputs, prompts, completions, completion_ids_list):
        skip = ("prompt", "completion", "completion_ids")
        reward_kwargs = {key: [row[key] for row in inputs] for key in inputs[0] if key not in skip}
        self._reward_batch = (inputs, completion_ids_list)
        try:
            local = self.compute_rewards(completions, prompts, **self._accepted_reward_kwargs(reward_kwargs))
        finally:
            self._reward_batch = None
        rewards_per_func = gather(self._as_reward_matrix(local, len(prompts)))
        weights = self.reward_weights.to(rewards_per_func.device)
        self.current_rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1).detach().cpu()
        if not self.model.training:  # kept for compute_metrics after evaluation
            truths = reward_kwargs.get("ground_truth") or [None] * len(completions)
            self._eval_records += [(completion_text(c), t) for c, t in zip(completions, truths, strict=True)]
        return rewards_per_func

    def _accepted_reward_kwargs(self, reward_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The dataset columns an override's signature takes: all with ``**kwargs``, else those it names
        (the reference's ``compute_rewards(self, completions, prompts)`` takes none)."""
        parameters = inspect.signature(self.compute_rewards).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return reward_kwargs
        return {k: v for k, v in reward_kwargs.items() if k in parameters}

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

    # ------------------------------------------------------------------ generation

    def generate_hook(self, prompts: list):
        """TRL's generation; with a rollout server (vllm_mode server) its health is checked first, so a server that
        is gone ends the process cleanly (the watchdog's exit, naming the URL) instead of hanging generation or
        the weight sync."""
        url = rollout_server_url(self.args)
        if url is None:
            with waiting_for("generation"):
                return self.trl_generate(prompts)
        limit = server_check_timeout(self.args)
        if limit is not None:  # the watchdog is on: a server gone for good ends the process
            wait_for_server(f"{url}/health", limit)
        with waiting_for(f"generation by the rollout server at {url}"):
            return self.trl_generate(prompts)

    # ------------------------------------------------------------------ telemetry

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        kl = self.trl_metrics["train"].get("kl")
        self.current_kl = torch.tensor(kl[-1:] if kl else [0.0], dtype=torch.float32)
        return loss

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """TRL's log, accepting 0-d tensors (``self.current_rewards.mean()``) as the reference does."""
        logs = {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in logs.items()}
        super().log(logs, start_time)

    # ------------------------------------------------------------------ evaluation

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, **kwargs):
        """TRL's evaluation (generation, rewards, loss), then ``compute_metrics`` on what was generated."""
        self._eval_records = []
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, **kwargs)
        prefix = kwargs.get("metric_key_prefix", "eval")
        # TRL reports its eval metrics (reward, completion lengths, ...) only through log(); return them too.
        for key, values in self.trl_metrics["eval"].items():
            valid = [v for v in values if not math.isnan(v)]
            if valid:
                output.metrics.setdefault(f"{prefix}_{key}", sum(valid) / len(valid))
        # every rank takes part in the gather, even one without records
        records = gather_object(self._eval_records) if self.compute_metrics is not None else []
        if records:
            prediction = EvalPrediction(
                predictions=np.array([r[0] for r in records], dtype=object),
                label_ids=np.array([r[1] for r in records], dtype=object),
            )
            for key, value in self.compute_metrics(prediction).items():
                output.metrics[key if key.startswith(f"{prefix}_") else f"{prefix}_{key}"] = value
        self._eval_records = []
        return output


class _SubclassHooks(TrainerCallback):
    """Calls callback-named methods a trainer subclass defines on itself (the reference's override style)."""

    EVENTS = (
        "on_train_begin",
        "on_train_end",
        "on_epoch_begin",
        "on_epoch_end",
        "on_step_begin",
        "on_step_end",
        "on_evaluate",
        "on_log",
        "on_save",
    )

    def __init__(self, trainer: GRPOTrainer):
        self.hooks = {}
        for event in self.EVENTS:
            method = getattr(trainer, event, None)
            if callable(method):
                takes_arguments = bool(inspect.signature(method).parameters)
                self.hooks[event] = (method, takes_arguments)

    def _dispatch(self, event, args, state, control, **kwargs):
        hook = self.hooks.get(event)
        if hook is None:
            return None
        method, takes_arguments = hook
        result = method(args, state, control, **kwargs) if takes_arguments else method()
        return result if isinstance(result, type(control)) else None


def _forwarder(event: str):
    def forward(self, args, state, control, **kwargs):
        return self._dispatch(event, args, state, control, **kwargs)

    forward.__name__ = event
    return forward


for _event in _SubclassHooks.EVENTS:
    setattr(_SubclassHooks, _event, _forwarder(_event))


def _one_of(alias: str, alias_value: Any, name: str, value: Any) -> Any:
    """One value given under either of two names (the reference API's alias or TRL's name), never two."""
    if alias_value is None:
        return value
    if value is not None and value is not alias_value:
        raise ValueError(f"{alias}: pass either {alias} or {name}, not both")
    return alias_value


def _prepare_args(args: Any) -> None:
    """What the config derives before TRL reads it: the generation batch, and the attention implementation
    handed to the model's loading."""
    if hasattr(args, "rederive_generation_batch"):
        args.rederive_generation_batch()
    attn_implementation = getattr(args, "attn_implementation", None)
    if attn_implementation and args is not None:
        args.model_init_kwargs = {**(args.model_init_kwargs or {}), "attn_implementation": attn_implementation}


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]
