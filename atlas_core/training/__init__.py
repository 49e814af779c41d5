"""One training job: its configuration, data, trainers, checkpoints, resume, preemption, tracking and what
follows it."""
