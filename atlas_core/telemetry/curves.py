"""The training curves of a run as one PNG, from its ``metrics.jsonl`` (an artifact of its tracking run)."""

from __future__ import annotations

import json
from pathlib import Path

#: The curves drawn, by their log key (atlas_contract/metrics.py names them for Prometheus), one panel each.
CURVES = ("reward", "kl", "loss", "teaching/accuracy_delta")


def plot_curves(metrics_file: Path, png: Path) -> Path | None:
    """Reward, KL, loss and the teaching delta against the step, from ``metrics_file``; None when it logged none."""
    series: dict[str, list[tuple[int, float]]] = {key: [] for key in CURVES}
    try:
        lines = metrics_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill: the rest is whole
        for key in CURVES:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                series[key].append((int(record.get("step", 0)), float(value)))
    drawn = {key: points for key, points in series.items() if points}
    if not drawn:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(len(drawn), 1, figsize=(6, 2.2 * len(drawn)), sharex=True, squeeze=False)
    for axis, (key, points) in zip(axes[:, 0], drawn.items(), strict=True):
        axis.plot([step for step, _ in points], [value for _, value in points], marker=".", linewidth=1)
        axis.set_ylabel(key)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=100)
    pyplot.close(figure)
    return png
