"""The trainers: TRL's GRPO and SFT with Atlas's hooks, and GRPO on a teacher rewarded by its student."""
