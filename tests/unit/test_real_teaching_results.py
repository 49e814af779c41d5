"""bench/real_teaching.py's results file (bench/real_teaching_results.py): each seed's line, and a summary that
checks the targets on the minimum over at least three seeds and refuses seeds run with different settings. The
figures come from per-problem records through the evaluation's own ``figures``."""

from __future__ import annotations

import pytest

from atlas_core.evaluation_figures import figures
from bench import real_teaching_results as results

SETTINGS = {"minutes": 45.0, "problems": 20, "student": "in-process"}


def _records(alone: list[float], guided: list[float]) -> list[dict]:
    return [
        {
            "accuracy_alone": a,
            "accuracy_guided": g,
            "answers_alone": ["\\boxed{1}"],
            "answers_guided": ["\\boxed{1}"],
            "guidance_tokens": 10,
            "tokens_alone": [5],
            "tokens_guided": [5],
            "teaching_reward": 0.0,
        }
        for a, g in zip(alone, guided, strict=True)
    ]


def _seed_line(seed: int, helped: int, hurt: int = 0, settings: dict = SETTINGS) -> dict:
    """20 problems: the untrained teacher helps none; the trained one turns ``helped`` wrong answers right and
    ``hurt`` right ones wrong."""
    alone = [0.0] * 10 + [1.0] * 10
    trained = [1.0 if i < helped else 0.0 for i in range(10)] + [0.0 if i < hurt else 1.0 for i in range(10)]
    reports = {
        "untrained teacher": figures(_records(alone, alone)),
        "trained teacher": figures(_records(alone, trained)),
    }
    return results.record(seed, settings, reports, seconds=2700.0)


def test_three_seeds_meet_the_targets_on_their_minimum(tmp_path):
    path = tmp_path / "results.jsonl"
    for seed in (0, 1, 2):
        results.append(path, _seed_line(seed, helped=5))  # +25 points each, nothing hurt
    lines = results.read(path)
    assert [line["seed"] for line in lines] == [0, 1, 2] and lines[0]["commit"] and lines[0]["settings"] == SETTINGS
    text, met = results.summary(results.one_settings(lines))
    assert met, "\n".join(text)
    assert "delta mean +25.0 pts, min +25.0" in "\n".join(text)
    assert len([t for t in text if t.lstrip().startswith(("0 ", "1 ", "2 "))]) == 6  # each seed's two teachers


def test_the_minimum_seed_decides_and_two_seeds_are_not_enough(tmp_path):
    lines = [_seed_line(0, helped=5), _seed_line(1, helped=5), _seed_line(2, helped=3)]  # +15.0 < +15.7
    text, met = results.summary(lines)
    assert not met and any("MISS  min delta >= +15.7 pts: 15.000" in t for t in text), text
    hurt = [_seed_line(0, helped=6, hurt=1), _seed_line(1, helped=5), _seed_line(2, helped=5)]  # 95% kept < 97%
    text, met = results.summary(hurt)
    assert not met and any(t.strip().startswith("MISS  min non-degradation") for t in text), text
    text, met = results.summary([_seed_line(0, helped=5), _seed_line(1, helped=5)])
    assert not met and any("MISS  at least 3 seeds" in t for t in text), text


def test_seeds_of_different_settings_are_not_summarized_together(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(path, _seed_line(0, helped=5))
    results.append(path, _seed_line(1, helped=5, settings={**SETTINGS, "minutes": 30.0}))
    with pytest.raises(results.MixedSettings, match=r"(?s)1: seeds \[0\].*2: seeds \[1\].*\"minutes\": 30.0"):
        results.one_settings(results.read(path))
    assert results.print_summary(path) == 2
    assert [line["seed"] for line in results.one_settings(results.read(path), pick=2)] == [1]
