"""The training library: GRPO and SFT for LLM teachers, the adaptive teaching protocol, RIM rewards and the
evaluation, on a cluster's trainer pods or on one machine."""
