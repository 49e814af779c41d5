"""What the `atlas` training subcommands share on screen: figures as points, and libraries kept quiet."""

from __future__ import annotations


def points(value: float | None) -> str:
    """An accuracy delta (0-1) as signed percentage points; – when unknown."""
    return "–" if value is None else f"{100 * value:+.1f}"


def quiet_libraries(hide_warnings: bool = False) -> None:
    """The command shows its own progress: no library bars or load reports (and, with ``hide_warnings``, no Python
    warnings either). A library not installed (an endpoint-only `atlas eval`) is skipped."""
    import warnings

    if hide_warnings:
        warnings.filterwarnings("ignore")
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass
