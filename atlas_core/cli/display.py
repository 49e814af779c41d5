"""What the `atlas` training subcommands share on screen: figures as points, and libraries kept quiet."""

from __future__ import annotations


def points(value: float | None) -> str:
    """An accuracy delta (0-1) as signed percentage points; – when unknown."""
    return "–" if value is None else f"{100 * value:+.1f}"


PIPED_WIDTH = 240  # wide enough for the demo's and atlas eval's tables; a table takes only the width it needs


def console(stderr: bool = False):
    """A rich Console; when the output is not a terminal (a pipe, a log file, CI), tables keep their whole width
    instead of rich's 80 columns, which cut headers and cells ("teacher-…", "non-degra…"); $COLUMNS still decides
    when it is set."""
    import os

    from rich.console import Console

    screen = Console(stderr=stderr)
    if screen.is_terminal or os.environ.get("COLUMNS"):
        return screen
    return Console(stderr=stderr, width=PIPED_WIDTH)


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
