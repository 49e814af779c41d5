"""The models a run names by ``builtin://``, built locally or read offline, and loading a trained model."""
