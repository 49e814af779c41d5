"""Supervised warm-up before RL: TRL's SFTTrainer, loss on the completion only.

Datasets in prompt/completion form (``{"prompt": [...], "completion": [...]}``) are trained
on the completion tokens only (TRL's ``completion_only_loss``, on by default here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trl

from atlas_core.models.loading import merged_if_adapter
from atlas_core.models.tiny import policy_model
from atlas_core.training.algorithms.grpo_config import AtlasArguments
from atlas_core.training.callbacks import telemetry_callbacks
from atlas_core.training.checkpoints import AtomicCheckpoints
from atlas_core.training.lora import trainer_peft_config
from atlas_core.training.preemption import stop_callbacks
from atlas_core.training.watchdog import watchdog_callbacks


@dataclass
class SFTConfig(trl.SFTConfig, AtlasArguments):
    r"""TRL's [`~trl.SFTConfig`] with Atlas's model and telemetry fields (see ``AtlasArguments``).

    Parameters:
        completion_only_loss (`bool`, *optional*, defaults to `True`):
            Train on completion tokens only (prompt/completion datasets). TRL's default is ``None`` (auto).
    """

    completion_only_loss: bool | None = field(
        default=True, metadata={"help": "Train on completion tokens only (prompt/completion datasets)."}
    )

    def __post_init__(self):
        self._default_to_hardware()
        super().__post_init__()
        self._resolve_atlas_fields()


class SFTTrainer(AtomicCheckpoints, trl.SFTTrainer):
    """TRL's SFTTrainer (``args.lora`` or TRL's ``peft_config`` trains a LoRA adapter); also accepts ``tokenizer``
    (for ``processing_class``) and ``max_seq_length`` (for ``args.max_length``), as the trainers reference
    documents, and a ``model`` taken from ``args.model_name_or_path`` when omitted."""

    args: trl.SFTConfig  # TRL's SFTTrainer makes one when given none

    def __init__(
        self,
        model: Any = None,
        args: trl.SFTConfig | None = None,
        *,
        tokenizer=None,
        max_seq_length: int | None = None,
        **kwargs: Any,
    ):
        model = merged_if_adapter(policy_model(model, args, "SFTConfig"), args)  # a LoRA run's adapter: merged
        kwargs["peft_config"] = trainer_peft_config(args, kwargs.get("peft_config"), model)
        if args is not None and hasattr(args, "resync_resolved_fields"):
            args.resync_resolved_fields()  # settings changed after the config was built
        if tokenizer is not None:
            if kwargs.get("processing_class") is not None:
                raise ValueError("tokenizer: pass either tokenizer or processing_class, not both")
            kwargs["processing_class"] = tokenizer
        if max_seq_length is not None and args is not None:
            args.max_length = max_seq_length
        kwargs["callbacks"] = [
            *(kwargs.get("callbacks") or []),
            *telemetry_callbacks(args),
            *watchdog_callbacks(args),
            *stop_callbacks(args),
        ]
        super().__init__(model=model, args=args, **kwargs)

    def format_dataset(self, dataset):
        """Render each example's ``messages`` with the tokenizer's chat template into a ``text`` column."""
        tokenizer = self.processing_class

        def formatting_func(example):
            return {"text": tokenizer.apply_chat_template(example["messages"], tokenize=False)}

        if "messages" not in dataset.column_names:
            raise ValueError(f"dataset: expected a 'messages' column, got {', '.join(dataset.column_names)}")
        return dataset.map(formatting_func)

    def pack_sequences(self, tokenized_dataset, seq_length: int | None = None):
        """Pack tokenized examples (``input_ids``) into rows of at most ``seq_length`` tokens
        (default ``args.max_length``) with TRL's best-fit-decreasing packing; ``seq_lengths`` keeps
        the boundaries so attention does not cross examples."""
        from trl.data_utils import pack_dataset

        length = seq_length or self.args.max_length
        if not length:
            raise ValueError("seq_length: pass one, or set args.max_length (max_seq_length)")
        return pack_dataset(tokenized_dataset, seq_length=length, strategy="bfd")
