"""The training library's commands: ``atlas demo``, ``atlas eval`` and what trainer pods run (train, export)."""
