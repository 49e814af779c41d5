"""What the fences around third-party private APIs share (atlas_core/training/algorithms/trl_hooks.py,
atlas_core/training/checkpoints.py): each hooked method must still exist, take the parameters it took in the
tested release, and still do what the hook relies on."""

from __future__ import annotations

import inspect


def hook_problems(owner: type, label: str, hooked: dict[str, tuple[str, ...]], uses: dict | None = None) -> list[str]:
    """What no longer matches in ``owner`` (named ``label`` in messages): for each method of ``hooked``, its
    parameters; for each of ``uses`` (method → strings), whether its source still holds each string."""
    problems = []
    for name, wanted in hooked.items():
        method = getattr(owner, name, None)
        if method is None:
            problems.append(f"{label}.{name} is gone")
            continue
        found = tuple(inspect.signature(method).parameters)
        if found != wanted:
            problems.append(f"{label}.{name} takes ({', '.join(found)}), not ({', '.join(wanted)})")
        needed = (uses or {}).get(name, ())
        source = inspect.getsource(method) if needed else ""
        problems += [f"{label}.{name} no longer calls {use}" for use in needed if use not in source]
    return problems
