"""SFT warm-up: TRL's SFTTrainer trains on the completion tokens only."""

from datasets import Dataset

from atlas_core.tasks.arithmetic import make_sft_dataset
from atlas_core.training.algorithms.sft import SFTConfig, SFTTrainer


def make_trainer(tmp_path, model_dir, **overrides):
    values = dict(
        output_dir=str(tmp_path / "sft"),
        model_name_or_path=str(model_dir),
        max_steps=40,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    values.update(overrides)
    return SFTTrainer(args=SFTConfig(**values), train_dataset=Dataset.from_list(make_sft_dataset(200)))


def test_loss_is_on_the_completion_only(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir)
    tokenizer = trainer.processing_class
    batch = next(iter(trainer.get_train_dataloader()))
    assistant_header = tokenizer("<|im_start|>assistant\n")["input_ids"]
    for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
        # the completion starts right after the assistant header of the chat template
        start = next(
            i + len(assistant_header) for i in range(len(ids)) if ids[i : i + len(assistant_header)] == assistant_header
        )
        assert all(label == -100 for label in labels[:start])
        trained = [(i, label) for i, label in enumerate(labels) if label != -100]
        assert trained and trained[0][0] == start
        assert all(ids[i] == label for i, label in trained)
        assert tokenizer.decode([label for _, label in trained]).startswith(tokenizer.decode(ids[start : start + 3]))


def test_warm_up_lowers_the_loss(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < losses[0] * 0.7


def test_reference_aliases_tokenizer_and_max_seq_length(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = SFTConfig(output_dir=str(tmp_path / "x"), report_to=[], max_steps=1, gradient_checkpointing=False)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=args,
        train_dataset=Dataset.from_list(make_sft_dataset(16)),
        tokenizer=tokenizer,
        max_seq_length=24,
    )
    assert trainer.processing_class is tokenizer
    assert trainer.args.max_length == 24
    assert max(len(x) for x in trainer.train_dataset["input_ids"]) <= 24
