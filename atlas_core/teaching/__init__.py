"""The adaptive teaching protocol, the one implementation teacher training and evaluation both run: its text
(prompts), the frozen student, and the batched protocol. Below training and evaluation, above the tasks."""
