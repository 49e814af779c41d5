"""Repository tools (not shipped in any image): generators of checked-in files that need more than the Python
models, run from the repository root as ``python -m tools.<name>``."""
