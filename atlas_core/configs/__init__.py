"""The Hydra configuration tree of a run: ``train.yaml`` and its recipes (``recipe/*.yaml``)."""
