"""bench/real_teaching.py's results file: one line per seed, appended as each seed finishes (seeds may run in
different sittings), and the summary over them.

A line holds the seed, when and at which commit it ran, the machine, the minutes it took, the settings that decide the
result (everything but the seed: training minutes and shares, the stages' overrides, the held-out problems, where the
student ran) and the figures of each teacher. The summary prints each seed's table, the mean and the minimum, and
checks the targets on the minimum over at least :data:`MIN_SEEDS` seeds: ATLAS's headline delta (+15.7 points, 8B
teacher and 4B student) with its 95% interval above 0, non-degradation >= 97%, and the trained teacher better than
the untrained one. It refuses a file whose lines were run with different settings (``--settings N`` picks one group).

    python -m bench.real_teaching_results [FILE] [--settings N]   # the summary (as real_teaching.py --summary)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

DEFAULT_FILE = Path(__file__).resolve().parent / "results" / "real_teaching.jsonl"
MIN_SEEDS = 3
TARGET_DELTA_POINTS = 15.7  # ATLAS's headline: 62.3% -> 78.0%
TARGET_NON_DEGRADATION = 0.97
FIGURES = (
    "student_accuracy",
    "guided_accuracy",
    "accuracy_delta",
    "accuracy_delta_low",
    "accuracy_delta_high",
    "non_degradation_rate",
    "guidance_tokens_mean",
)
TEACHERS = ("untrained teacher", "trained teacher")


class MixedSettings(ValueError):
    """The file's seeds ran with different settings: a summary over them would compare unlike runs."""


def commit() -> str:
    """The checkout's commit, with ``+dirty`` when it has uncommitted changes (``unknown`` outside git)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def record(seed: int, settings: dict, reports: dict, seconds: float) -> dict:
    """One seed's line: ``reports`` maps each of :data:`TEACHERS` to its evaluation (``Figures``)."""
    return {
        "seed": seed,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit(),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "seconds": round(seconds, 1),
        "settings": settings,
        "teachers": {label: {name: getattr(reports[label], name) for name in FIGURES} for label in TEACHERS},
    }


def append(path: Path, line: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as sink:
        sink.write(json.dumps(line, sort_keys=True) + "\n")


def read(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines() if text.strip()] if path.is_file() else []


def settings_groups(lines: list[dict]) -> list[list[dict]]:
    """The lines grouped by their settings, in the order each group first appears."""
    groups: dict[str, list[dict]] = {}
    for line in lines:
        groups.setdefault(json.dumps(line["settings"], sort_keys=True), []).append(line)
    return list(groups.values())


def one_settings(lines: list[dict], pick: int | None = None) -> list[dict]:
    """The lines of one settings group: the only one, or group ``pick`` (1-based); :class:`MixedSettings` naming
    the groups otherwise."""
    groups = settings_groups(lines)
    if pick is not None:
        if not 1 <= pick <= len(groups):
            raise MixedSettings(f"--settings {pick}: the file has {len(groups)} settings group(s)")
        return groups[pick - 1]
    if len(groups) > 1:
        described = [
            f"  {i}: seeds {[line['seed'] for line in group]}: {json.dumps(group[0]['settings'], sort_keys=True)}"
            for i, group in enumerate(groups, 1)
        ]
        raise MixedSettings(
            "the seeds ran with different settings; pick one group with --settings N:\n" + "\n".join(described)
        )
    return groups[0] if groups else []


def summary(lines: list[dict]) -> tuple[list[str], bool]:
    """The summary's lines and whether every target holds on the minimum over the seeds (one settings group)."""
    out = [f"{'seed':>6}{'':2}{'teacher':20}{'alone':>8}{'guided':>8}{'delta pts':>11}{'95% CI':>16}{'non-degr.':>11}"]
    out[0] += f"{'minutes':>9}  commit"
    for line in sorted(lines, key=lambda line: line["seed"]):
        for label in TEACHERS:
            f = line["teachers"][label]
            interval = f"[{100 * f['accuracy_delta_low']:+.1f}, {100 * f['accuracy_delta_high']:+.1f}]"
            out.append(
                f"{line['seed']:>6}{'':2}{label:20}{f['student_accuracy']:>8.1%}{f['guided_accuracy']:>8.1%}"
                f"{100 * f['accuracy_delta']:>+11.1f}{interval:>16}{f['non_degradation_rate']:>11.1%}"
                f"{line['seconds'] / 60:>9.1f}  {line['commit'][:12]}"
            )
    if not lines:
        return [*out, "no seed recorded yet"], False

    def trained(name: str) -> list[float]:
        return [line["teachers"]["trained teacher"][name] for line in lines]

    margins = [
        line["teachers"]["trained teacher"]["accuracy_delta"] - line["teachers"]["untrained teacher"]["accuracy_delta"]
        for line in lines
    ]
    deltas, lows, kept = trained("accuracy_delta"), trained("accuracy_delta_low"), trained("non_degradation_rate")
    out.append("")
    out.append(
        f"trained teacher over {len(lines)} seed(s): delta mean {100 * statistics.mean(deltas):+.1f} pts, "
        f"min {100 * min(deltas):+.1f}; non-degradation mean {statistics.mean(kept):.1%}, min {min(kept):.1%}"
    )
    checks = [
        (f"at least {MIN_SEEDS} seeds", len(lines), len(lines) >= MIN_SEEDS),
        (f"min delta >= +{TARGET_DELTA_POINTS} pts", 100 * min(deltas), 100 * min(deltas) >= TARGET_DELTA_POINTS),
        ("min of the 95% interval's low end > 0 (pts)", 100 * min(lows), min(lows) > 0),
        (f"min non-degradation >= {TARGET_NON_DEGRADATION:.0%}", min(kept), min(kept) >= TARGET_NON_DEGRADATION),
        ("min delta, trained - untrained (pts) > 0", 100 * min(margins), min(margins) > 0),
    ]
    out += [f"  {'PASS' if ok else 'MISS'}  {name}: {value:.3f}" for name, value, ok in checks]
    return out, all(ok for _, _, ok in checks)


def print_summary(path: Path, pick: int | None = None) -> int:
    """Print the summary of ``path``; 0 when every target holds, 1 when one misses, 2 on mixed settings."""
    try:
        lines = one_settings(read(path), pick)
    except MixedSettings as exc:
        print(f"{path}: {exc}")
        return 2
    text, met = summary(lines)
    print(f"{path}: builtin://multistep held-out problems, student and teacher SmolLM2-135M-Instruct")
    if lines:
        print(f"settings: {json.dumps(lines[0]['settings'], sort_keys=True)}")
    print("\n".join(text))
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE, help=f"default {DEFAULT_FILE.name}")
    parser.add_argument("--settings", type=int, help="the settings group to summarize (1-based), when they differ")
    args = parser.parse_args()
    return print_summary(args.file, args.settings)


if __name__ == "__main__":
    raise SystemExit(main())
