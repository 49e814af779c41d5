"""``atlas eval``: the two-pass evaluation from the command line, against the tiny model and against real
OpenAI-compatible servers on 127.0.0.1 (harness/judge_server.py): its files and figures, bad input, an endpoint
that dies mid-way and the resume, and the eval gauges on /metrics."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import threading
import urllib.request
from pathlib import Path

import pytest

from atlas_cli.main import main as atlas
from atlas_contract.defaults import TEACHING
from atlas_core.answers import SYSTEM_HINT
from atlas_core.evaluation_figures import TeachingEvaluation
from atlas_core.tasks import multistep
from atlas_core.teaching.prompts import GUIDANCE_INTRO, PROBE_INSTRUCTION, TEACHER_TEMPLATES
from harness.env import free_port
from harness.judge_server import Call, JudgeServer, Reply

#: The keys of a problems.jsonl line (docs/evaluation.md, "`atlas eval`").
PROBLEM_KEYS = {
    "index",
    "fingerprint",
    "task",
    "ground_truth",
    "capability",
    "capability_level",
    "probe",
    "guidance",
    "guidance_tokens",
    "answers_alone",
    "scores_alone",
    "tokens_alone",
    "answers_guided",
    "scores_guided",
    "tokens_guided",
    "accuracy_alone",
    "accuracy_guided",
    "teaching_reward",
}
SMALL = ["--teacher-max-tokens", "16", "--student-max-tokens", "8", "--max-probe-tokens", "4"]
TEACHING_TEXT = "<thinking>They add the first two.</thinking><teaching>Add the numbers from left to right.</teaching>"


def eval_cmd(teacher: str, student: str, output: Path, *extra: str, dataset: str = "builtin://multistep") -> list[str]:
    return ["eval", "--teacher", teacher, "--student", student, "--dataset", dataset, "--output", str(output), *extra]


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def read_outputs(output: Path) -> tuple[dict, list[dict]]:
    report = json.loads((output / "eval.json").read_text())
    lines = [json.loads(line) for line in (output / "problems.jsonl").read_text().splitlines()]
    return report, lines


def question_of(task: str) -> str:
    return task.split("What is ", 1)[1].split("?", 1)[0]


def check_figures(figures: dict, records: list[dict]) -> None:
    """Every figure in range, and the accuracies the means of the per-problem lines."""
    assert figures["problems"] == len(records)
    if not records:
        assert figures["student_accuracy"] is None and figures["guided_accuracy"] is None
        return
    alone = [r["accuracy_alone"] for r in records]
    guided = [r["accuracy_guided"] for r in records]
    assert figures["student_accuracy"] == pytest.approx(statistics.mean(alone))
    assert figures["guided_accuracy"] == pytest.approx(statistics.mean(guided))
    assert figures["accuracy_delta"] == pytest.approx(statistics.mean(guided) - statistics.mean(alone))
    assert figures["accuracy_delta_low"] - 1e-9 <= figures["accuracy_delta"] <= figures["accuracy_delta_high"] + 1e-9
    assert figures["non_degradation_rate"] == pytest.approx(
        statistics.mean(g >= a for a, g in zip(alone, guided, strict=True))
    )
    for name in (
        "student_accuracy",
        "guided_accuracy",
        "non_degradation_rate",
        "improvement_rate",
        "completion_rate_alone",
        "completion_rate_guided",
    ):
        assert 0.0 <= figures[name] <= 1.0, name
    assert -1.0 <= figures["accuracy_delta_low"] <= figures["accuracy_delta_high"] <= 1.0
    assert figures["mean_degradation"] is None or 0.0 < figures["mean_degradation"] <= 1.0
    for name in ("guidance_tokens_mean", "student_tokens_alone_mean", "student_tokens_guided_mean"):
        assert figures[name] >= 0, name
    penalty = TEACHING["degradation_penalty"]
    assert -1.0 - penalty <= figures["teaching_reward_mean"] <= 2.0
    assert figures["teaching_reward_mean"] == pytest.approx(statistics.mean(r["teaching_reward"] for r in records))


# ------------------------------------------------------------------ local models


def test_tiny_models_on_the_multistep_test_split(tmp_path, atlas_cache, capsys):
    output = tmp_path / "eval"
    code = atlas(eval_cmd("builtin://tiny-llama", "builtin://tiny-llama", output, "--limit", "6", "-k", "2", *SMALL))
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    report, lines = read_outputs(output)

    assert set(report) == {f.name for f in dataclasses.fields(TeachingEvaluation)}
    assert (report["teacher"], report["student"]) == ("builtin://tiny-llama", "builtin://tiny-llama")
    assert (report["dataset"], report["split"], report["scorer"]) == ("builtin://multistep", "test", "exact_match")
    assert (report["samples"], report["seed"], report["token_unit"]) == (2, 0, "tokens")
    assert len(lines) == 6 and report["problems"] == 6
    for i, line in enumerate(lines):
        assert set(line) == PROBLEM_KEYS
        assert line["index"] == i
        assert multistep.split_of(question_of(line["task"])) == "test"
        for key in ("scores_alone", "scores_guided", "answers_alone", "answers_guided", "tokens_alone"):
            assert len(line[key]) == 2, key
        assert line["accuracy_alone"] == pytest.approx(statistics.mean(line["scores_alone"]))
        assert line["accuracy_guided"] == pytest.approx(statistics.mean(line["scores_guided"]))
        assert line["capability"] in ("weak", "moderate", "strong") and 0 <= line["capability_level"] <= 1
        assert all(0 < t <= 8 for t in line["tokens_alone"] + line["tokens_guided"])  # --student-max-tokens
    # the first 6 of the split's fixed mix, in order
    assert [question_of(line["task"]) for line in lines] == [
        r["question"] for r in multistep.make_multistep_dataset(6, "test")
    ]
    check_figures(report, lines)
    assert set(report["by_capability"]) == {"weak", "moderate", "strong"}
    for band, figures in report["by_capability"].items():
        check_figures(figures, [line for line in lines if line["capability"] == band])
    assert sum(f["problems"] for f in report["by_capability"].values()) == 6
    # the table and where the files are
    assert "accuracy alone" in captured.out and "non-degradation" in captured.out
    assert f"eval.json: {output / 'eval.json'}\n" in captured.out
    assert f"problems.jsonl: {output / 'problems.jsonl'}\n" in captured.out


# ------------------------------------------------------------------ endpoints


def _answer(call: Call) -> str:
    """A scripted student: describes its approach when probed, is right only with the teacher's guidance."""
    text = "\n".join(m["content"] for m in call.messages)
    if PROBE_INSTRUCTION in text:
        return "I would add the numbers."
    if GUIDANCE_INTRO in text:
        total = sum(int(x) for x in question_of(text).split(" + "))
        return f"The sum is \\boxed{{{total}}}"
    return "\\boxed{0}"


class Student:
    """The scripted student; ``fail_after`` successful calls, every further one answers 500 (Retry-After: 0,
    so the client's retries are spent at once) until ``fail_after`` is None again."""

    def __init__(self):
        self.fail_after: int | None = None
        self.answered: list[Call] = []
        self._lock = threading.Lock()

    def __call__(self, call: Call) -> Reply:
        with self._lock:
            if self.fail_after is not None and len(self.answered) >= self.fail_after:
                return Reply(status=500, headers={"Retry-After": "0"})
            self.answered.append(call)
        return Reply(_answer(call))


def teacher_script(call: Call) -> Reply:
    return Reply(TEACHING_TEXT)


def test_endpoints_teaching_that_helps_and_the_eval_gauges(tmp_path, capsys, monkeypatch, fresh_trainer_metrics):
    from atlas_core.telemetry.metrics import stop_metrics_servers

    for name in ("ATLAS_NAMESPACE", "ATLAS_RUN", "ATLAS_KIND"):
        monkeypatch.delenv(name, raising=False)
    output = tmp_path / "endpoint-eval"
    port = free_port()
    student = Student()
    with JudgeServer(teacher_script, "teacher-model") as teacher_server, JudgeServer(student, "student-model") as sv:
        try:
            code = atlas(
                eval_cmd(
                    teacher_server.base_url,
                    f"http://127.0.0.1:{sv.port}",  # without /v1: the command adds it
                    output,
                    "--limit",
                    "5",
                    "-k",
                    "3",
                    "--metrics-port",
                    str(port),
                )
            )
            captured = capsys.readouterr()
            assert code == 0, captured.err[-3000:]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                scraped = response.read().decode()
        finally:
            stop_metrics_servers()
    report, lines = read_outputs(output)
    assert report["student_accuracy"] == 0.0 and report["guided_accuracy"] == 1.0
    assert report["accuracy_delta"] == pytest.approx(1.0) and report["non_degradation_rate"] == 1.0
    assert report["improvement_rate"] == 1.0 and report["mean_degradation"] is None
    assert report["token_unit"] == "words" and report["guidance_tokens_mean"] == len(
        "Add the numbers from left to right.".split()
    )
    assert len(lines) == 5 and all(line["capability"] == "weak" for line in lines)
    assert report["by_capability"]["weak"]["problems"] == 5 and report["by_capability"]["strong"]["problems"] == 0
    check_figures(report, lines)

    # the teacher got the capability template of a weak student: the walkthrough, with the task and the probe
    assert len(teacher_server.calls) == 5
    for call, line in zip(
        sorted(teacher_server.calls, key=lambda c: c.messages[1]["content"]),
        sorted(lines, key=lambda r: f"Task:\n{r['task']}"),
        strict=True,
    ):
        system, user = call.messages
        assert system["role"] == "system" and system["content"].startswith(TEACHER_TEMPLATES["walkthrough"])
        assert user["content"].startswith(f"Task:\n{line['task']}") and "I would add the numbers." in user["content"]
    # the student: a probe, K answers alone and K guided per problem, the guidance as the teacher wrote it
    assert {c.model for c in sv.calls} == {"student-model"} and len(sv.calls) == 3 * 5
    guided = [c for c in sv.calls if GUIDANCE_INTRO in c.messages[-1]["content"]]
    assert len(guided) == 5 and all("Add the numbers from left to right." in c.messages[-1]["content"] for c in guided)
    assert all(c.n == 3 for c in sv.calls if PROBE_INSTRUCTION not in c.messages[-1]["content"])

    # the gauges, labelled with the output folder's name and kind eval
    labels = f'kind="eval",namespace="local",run="{output.name}"'
    for metric, key in (
        ("atlas_eval_student_accuracy", "student_accuracy"),
        ("atlas_eval_guided_accuracy", "guided_accuracy"),
        ("atlas_eval_accuracy_delta", "accuracy_delta"),
        ("atlas_eval_non_degradation_rate", "non_degradation_rate"),
    ):
        found = re.search(rf"^{metric}\{{{re.escape(labels)}\}} (\S+)$", scraped, re.M)
        assert found, f"{metric} with {labels} not in /metrics:\n{scraped}"
        assert float(found.group(1)) == pytest.approx(report[key])


def test_endpoint_dies_mid_way_and_the_same_command_resumes(tmp_path, capsys):
    output = tmp_path / "resumed"
    student = Student()
    student.fail_after = 2 * 3 * 2  # two batches of 2 problems, 3 student calls each
    with JudgeServer(teacher_script, "teacher-model") as teacher_server:
        with JudgeServer(student, "student-model") as sv:
            limits = ("--limit", "6", "-k", "2", "--batch-size", "2")
            command = eval_cmd(teacher_server.base_url, sv.base_url, output, *limits)
            assert atlas(command) == 1
        stderr = capsys.readouterr().err
        (line,) = errors(stderr)
        assert "after 4 of 6 problems" in line and "HTTP 500" in line
        assert str(output / "problems.jsonl") in line and "run the same command again to resume" in line
        kept = (output / "problems.jsonl").read_text().splitlines()
        assert len(kept) == 4 and not (output / "eval.json").exists()
        assert len(teacher_server.calls) == 4

        # The server comes back on the same address. A fresh server, not a flag flipped on the old one: a request
        # the failed run had sent as it ended would otherwise be answered by the healthy student, and counted here.
        student.fail_after = None
        asked_before = len(student.answered)
        with JudgeServer(student, "student-model", port=sv.port):
            assert atlas(command) == 0, capsys.readouterr().err[-3000:]
        asked_again = student.answered[asked_before:]
    report, lines = read_outputs(output)
    assert report["problems"] == 6 and len(lines) == 6 and [r["index"] for r in lines] == list(range(6))
    assert (output / "problems.jsonl").read_text().splitlines()[:4] == kept  # the finished ones, untouched
    # only the 2 unfinished problems were asked: a probe, the answers alone and guided for each
    assert len(asked_again) == 3 * 2 and len(teacher_server.calls) == 4 + 2
    remaining = {line["task"] for line in lines[4:]}
    assert {c.messages[-1]["content"].split("\n\n")[0] for c in asked_again} == remaining
    assert report["student_accuracy"] == 0.0 and report["guided_accuracy"] == 1.0
    check_figures(report, lines)


def test_endpoints_down_at_start_are_named_before_any_model_loads(tmp_path, capsys):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes the folder rule, cannot load
    down = f"http://127.0.0.1:{free_port()}"

    # a model folder that would fail to load: not loaded, since the student's endpoint is down
    assert atlas(eval_cmd(str(broken), down, tmp_path / "a", "--limit", "2")) == 2
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"error: --student: endpoint {down} is not reachable (")
    assert not (tmp_path / "a").exists()

    # both down: both named
    other = f"http://127.0.0.1:{free_port()}/v1"
    assert atlas(eval_cmd(other, down, tmp_path / "b")) == 2
    lines = errors(capsys.readouterr().err)
    assert [line.split(":")[1].strip() for line in lines] == ["--teacher", "--student"]

    # the endpoint is up: the model folder is loaded, fails, and is named; no problem is evaluated
    with JudgeServer(teacher_script, "student-model") as sv:
        assert atlas(eval_cmd(str(broken), sv.base_url, tmp_path / "c", "--limit", "2")) == 2
        lines = errors(capsys.readouterr().err)
        assert len(lines) == 1 and lines[0].startswith(f"error: --teacher: cannot load '{broken}'")
        assert sv.calls == []


# ------------------------------------------------------------------ bad input


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    ("case", "field"),
    [
        (["-k", "0"], "--samples"),
        (["--samples", "two"], "--samples"),
        (["--limit", "0"], "--limit"),
        (["--batch-size", "-1"], "--batch-size"),
        (["--max-guidance-tokens", "5"], "--max-guidance-tokens"),
        (["--student-temperature", "-1"], "--student-temperature"),
        (["--teacher", "{missing}"], "--teacher"),
        (["--student", "{file}"], "--student"),
        (["--student", "{empty_dir}"], "--student"),
        (["--teacher", "builtin://no-such-model"], "--teacher"),
        (["--dataset", "{missing}.jsonl"], "--dataset"),
        (["--dataset", "{no_truth}"], "--dataset"),
        (["--dataset", "builtin://teacher-multistep"], "--dataset"),
        (["--split", "validation"], "--split"),
        (["--dataset", "builtin://arithmetic", "--split", "validation"], "--split"),
        (["--dataset", "{empty}"], "--dataset"),
        (["--teacher", "http://[::1"], "--teacher"),
        (["-k", "99999999999999999999"], "--samples"),
        (["--limit", "99999999999"], "--limit"),
        (["--reward-funcs", "exact_match", "--reward-weights", "nan"], "--reward-weights[0]"),
        (["--reward-funcs", "exact_match", "--reward-weights", "inf"], "--reward-weights[0]"),
        (["--reward-funcs", "exact_match,telepathy"], "--reward-funcs"),
        (["--reward-funcs", "exact_match", "--reward-weights", "1,2"], "--reward-weights"),
        (["--reward-config", "no-such-config"], "--reward-config"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--output", "{file}"], "--output"),
    ],
)
def test_bad_input_exits_2_naming_the_option(tmp_path, capsys, case, field):
    (tmp_path / "model.bin").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    paths = {
        "missing": str(tmp_path / "missing"),
        "file": str(tmp_path / "model.bin"),
        "empty_dir": str(tmp_path / "empty"),
        "no_truth": _jsonl(tmp_path / "q.jsonl", [{"prompt": f"What is {i} + 1?", "split": "test"} for i in range(2)]),
        "empty": _jsonl(tmp_path / "empty.jsonl", []),
    }
    case = [arg.format(**paths) for arg in case]
    options = dict(zip(case[::2], case[1::2], strict=True))
    command = eval_cmd(
        options.pop("--teacher", "builtin://tiny-llama"),
        options.pop("--student", "builtin://tiny-llama"),
        Path(options.pop("--output", tmp_path / "out")),
        *(x for pair in options.items() if pair[0] != "--dataset" for x in pair),
        dataset=options.get("--dataset", "builtin://multistep"),
    )
    assert atlas(command) == 2
    captured = capsys.readouterr()
    lines = errors(captured.err)
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"error: {field}: "), lines
    assert "Traceback" not in captured.err and not (tmp_path / "out").exists()


def test_a_file_without_a_split_column_is_the_evaluation_set_whole(tmp_path, capsys):
    """--dataset names the evaluation set: a file without a ``split`` column is evaluated whole, whatever --split
    (no training source to hold out from; a run's own training file stays held out, tests/unit/test_preflight.py)."""
    rows = [{"prompt": f"What is {i} + 2 + 3? {SYSTEM_HINT}", "ground_truth": str(i + 5)} for i in range(1, 4)]
    dataset = _jsonl(tmp_path / "heldout.jsonl", rows)
    output = tmp_path / "whole"
    with JudgeServer(teacher_script, "teacher-model") as teacher_server, JudgeServer(Student(), "m") as sv:
        assert atlas(eval_cmd(teacher_server.base_url, sv.base_url, output, "-k", "1", dataset=dataset)) == 0
    stderr = capsys.readouterr().err
    assert f"note: --split test: '{dataset}' has no 'split' column; evaluating the whole file" in stderr
    report, lines = read_outputs(output)
    assert report["problems"] == 3 and [line["ground_truth"] for line in lines] == ["6", "7", "8"]
    assert report["student_accuracy"] == 0.0 and report["guided_accuracy"] == 1.0


def test_every_problem_at_once_and_no_ground_truth_is_fine_with_a_scorer(tmp_path, capsys):
    command = [
        "eval",
        "--teacher",
        str(tmp_path / "nope"),
        "--dataset",
        str(tmp_path / "nope.jsonl"),
        "-k",
        "0",
        "--limit",
        "-3",
        "--reward-funcs",
        "telepathy",
        "--reward-weights",
        "1",
        "--reward-weights",
        "2",
    ]
    assert atlas(command) == 2
    fields = [line.split(":")[1].strip() for line in errors(capsys.readouterr().err)]
    assert sorted(fields) == sorted(
        ["--samples", "--limit", "--reward-funcs", "--reward-weights", "--teacher", "--student", "--dataset"]
    )
    # with a scorer, rows without ground_truth are accepted (here a bad weight is the only problem left)
    rows = _jsonl(tmp_path / "q.jsonl", [{"prompt": "What is 1 + 1?", "split": "test"}])
    assert (
        atlas(
            eval_cmd(
                "builtin://tiny-llama",
                "builtin://tiny-llama",
                tmp_path / "o",
                "--reward-funcs",
                "boxed_format",
                "--reward-weights",
                "x",
                dataset=rows,
            )
        )
        == 2
    )
    assert [line.split(":")[1].strip() for line in errors(capsys.readouterr().err)] == ["--reward-weights"]


def test_another_evaluations_problems_file_is_refused_and_a_larger_limit_resumes(tmp_path, capsys):
    output = tmp_path / "shared"
    rows = [
        {"prompt": r["prompt"], "ground_truth": r["ground_truth"], "split": "test"}
        for r in multistep.problems("two-step", "test")
    ]
    dataset = _jsonl(tmp_path / "two-step.jsonl", rows[:5])
    with JudgeServer(teacher_script, "teacher-model") as teacher_server, JudgeServer(Student(), "m") as sv:

        def run(*extra: str) -> int:
            return atlas(eval_cmd(teacher_server.base_url, sv.base_url, output, *extra, dataset=dataset))

        assert run("--limit", "2", "-k", "1") == 0
        calls = len(sv.calls)
        assert run("--limit", "2", "-k", "2") == 2  # another K: another evaluation
        (line,) = errors(capsys.readouterr().err)
        assert line.startswith("error: --output: ") and "holds another evaluation" in line
        assert len(sv.calls) == calls  # refused before anything ran
        # a larger --limit over the same rows is the same evaluation: it resumes, asking only the new problems
        assert run("--limit", "3", "-k", "1") == 0
        assert len(sv.calls) == calls + 3
        assert json.loads((output / "eval.json").read_text())["problems"] == 3
        # a smaller --limit is the same evaluation too: its problems are done, nothing is asked, nothing lost
        calls = len(sv.calls)
        assert run("--limit", "2", "-k", "1") == 0
        assert len(sv.calls) == calls
    assert json.loads((output / "eval.json").read_text())["problems"] == 2
    assert len((output / "problems.jsonl").read_text().splitlines()) == 3


def test_the_whole_test_mix_is_the_largest_the_task_accepts():
    from atlas_core.cli.eval import whole_test_mix

    whole = whole_test_mix()
    assert len(multistep.make_multistep_dataset(whole, "test")) == whole
    with pytest.raises(ValueError):
        multistep.make_multistep_dataset(whole + 1, "test")
