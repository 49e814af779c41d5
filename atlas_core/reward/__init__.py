"""RIM rewards: LLM judges, their backends and their configuration."""
