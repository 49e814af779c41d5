"""``python -m atlas_core.cli.train`` and ``atlas train``: bad input, the composed recipe, the operator's subcommands
(the real runs: tests/training/test_cli_recipes.py)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from harness.env import PYTHON, REPO, python_env, run

QUICK = ["trainer.max_steps=2", "trainer.metrics_port=0", "trainer.save_steps=2"]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def main_here(args, capfd) -> tuple[int, str, str]:
    """``python -m atlas_core.cli.train ARGS``'s main() called in this process: its exit status, stdout and stderr.
    For what ends before anything trains (input refused, --print-config): a process each cost a Python start and
    the training library's imports, most of these tests' time. The tests that train (test_cli_recipes.py), and
    test_input_hardening.py's refused settings, run the command itself."""
    from atlas_core.cli.train import main

    code = main(list(args))
    captured = capfd.readouterr()
    return code, captured.out, captured.err


def refused(args, capfd) -> tuple[int, str]:
    """``main_here``'s exit status and stderr."""
    code, _, stderr = main_here(args, capfd)
    return code, stderr


def test_print_config_shows_the_composed_recipe(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = main_here(["recipe@_global_=grpo", "dataset.source=hf://org/data", "--print-config"], capfd)
    assert code == 0, stderr
    cfg = yaml.safe_load(stdout)
    assert cfg["model"] == "Arc-Intelligence/ATLAS-8B-Thinking"
    assert cfg["trainer"]["learning_rate"] == 5e-6 and cfg["trainer"]["num_generations"] == 8


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["recipe=nope"], ["recipe: unknown recipe (available: grpo, teacher_rcl, tiny_grpo, tiny_sft, tiny_teacher)"]),
        (["recipe=tiny_teacher", "student=null"], ["student: required for algorithm teacher"]),
        (["trainer.num_generations=abc"], ["trainer.num_generations: expected a whole number, got 'abc'"]),
        (["dataset.num_samples=abc"], ["dataset.num_samples: expected a whole number >= 1, got 'abc'"]),
        (["recipe=tiny_teacher", "student=/no/student"], ["student: '/no/student' does not exist"]),
        (["trainer.bogus=1"], ["trainer.bogus: not a GRPOConfig/SFTConfig field"]),
        (["nonsense=1"], ["nonsense: unknown configuration key"]),
        (["model=/no/such/model"], ["model: '/no/such/model' does not exist"]),
        (["recipe=grpo"], ["dataset.source: required"]),
        (
            ["trainer.num_generations=3"],
            ["trainer.num_generations: 3 does not divide the generation batch of 8 completions"],
        ),
        (
            ["model=/no/such/model", "dataset.source=/no/such.jsonl", "trainer.num_generations=3"],
            ["model: '/no/such/model'", "dataset.source: '/no/such.jsonl' does not exist", "trainer.num_generations"],
        ),
    ],
)
def test_bad_input_one_line_per_problem(tmp_path, monkeypatch, capfd, args, expected):
    monkeypatch.chdir(tmp_path)
    code, stderr = refused([*args, f"output_dir={tmp_path / 'o'}"], capfd)
    assert code == 2
    assert "Traceback" not in stderr
    lines = error_lines(stderr)
    assert len(lines) == len(expected), stderr
    for line, fragment in zip(lines, expected, strict=True):
        assert fragment in line


def test_dataset_without_prompt_column(tmp_path, atlas_cache, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n' * 4)
    code, stderr = refused([f"dataset.source={data}", f"output_dir={tmp_path / 'o'}", *QUICK], capfd)
    assert code == 2 and "Traceback" not in stderr
    assert error_lines(stderr) == [
        f"error: dataset.source: '{data}' has no 'prompt' column (columns: question, answer)"
    ]


def test_file_model_and_unreadable_hub_id(tmp_path, atlas_cache, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    code, stderr = refused([f"model={weights}", f"output_dir={tmp_path / 'o'}", *QUICK], capfd)
    assert code == 2 and "is a file" in stderr

    # A hub id cannot load offline: reported against `model`, no traceback.
    code, stderr = refused(["model=some-org/not-cached", f"output_dir={tmp_path / 'o'}", *QUICK], capfd)
    assert code == 2 and "Traceback" not in stderr
    assert error_lines(stderr)[0].startswith("error: model: cannot load 'some-org/not-cached'")


def test_invalid_manifest_lists_every_problem(tmp_path):
    manifest = tmp_path / "run.yaml"
    manifest.write_text("apiVersion: atlas.arc.computer/v1alpha1\nkind: AtlasTraining\nmetadata: {name: r}\n")
    proc = run([PYTHON, "-m", "atlas_cli.main", "train", str(manifest)], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "error: spec.model: required (the policy to train (the teacher for AtlasTeacher): a hub id, hf://org/name, "
        "s3://bucket/prefix, pvc://claim/path, builtin://… or a path (hub and S3 models are fetched once per run))",
        "error: spec.dataset: required (training prompts)",
    ]


def test_file_recipe_named_like_a_bundled_one_is_used(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "grpo.yaml"
    own.write_text("run_name: mine\nmodel: builtin://tiny-llama\ndataset:\n  source: builtin://arithmetic\n")
    code, stdout, stderr = main_here([f"recipe={own}", "--print-config"], capfd)
    assert code == 0, stderr
    cfg = yaml.safe_load(stdout)
    assert cfg["run_name"] == "mine" and cfg["model"] == "builtin://tiny-llama"


def test_data_without_ground_truth_for_exact_match(tmp_path, atlas_cache, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Say hi."}\n' * 8)
    for recipe in ("tiny_grpo", "tiny_teacher"):
        code, stderr = refused(
            [f"recipe={recipe}", f"dataset.source={data}", f"output_dir={tmp_path / 'o'}", *QUICK], capfd
        )
        assert code == 2 and "Traceback" not in stderr, stderr[-2000:]
        assert error_lines(stderr) == [
            f"error: dataset.source: '{data}' has no 'ground_truth' column, which exact-match scoring needs "
            "(columns: prompt)"
        ]


def test_run_files_any_name_and_unknown_keys_refused_as_on_the_command_line(tmp_path):
    """A run file is read as the command line is: its unknown keys are errors naming them, and any file
    name works (spaces, commas, quotes)."""
    from atlas_core.training.load_config import load_run_config, validate_run_config

    odd = tmp_path / "my run, v2 'final'.yaml"
    odd.write_text(
        "algorithm: grpo\nrsume: auto\ndataset:\n  source: builtin://arithmetic\n  num_sample: 8\n"
        "reward:\n  funcs: [exact_match]\ntrainer:\n  lerning_rate: 0.1\n"
    )
    problems = validate_run_config(load_run_config([f"recipe={odd}"]))
    assert [p.split(":")[0] for p in problems] == ["rsume", "dataset.num_sample", "trainer.lerning_rate"]
    assert "unknown configuration key" in problems[0] and "resume" in problems[0]
    odd.write_text("algorithm: grpo\nresume: sometimes\ndataset:\n  source: builtin://arithmetic\n")
    assert validate_run_config(load_run_config([f"recipe={odd}"])) == [
        "resume: expected auto (true), start_over or never (false), got 'sometimes'"
    ]


def test_manifests_and_run_files_in_the_encodings_editors_write(tmp_path, capsys):
    """UTF-16 with a BOM (PowerShell's `>`), UTF-8 with a BOM: read; other bytes: one line naming the file."""
    import codecs

    from atlas_operator.cli import render_main

    from atlas_core.training.load_config import load_run_config

    manifest = (REPO / "examples" / "grpo-run.yaml").read_text()
    for encoding, bom in (("utf-16-le", codecs.BOM_UTF16_LE), ("utf-8", codecs.BOM_UTF8)):
        path = tmp_path / f"run-{encoding}.yaml"
        path.write_bytes(bom + manifest.encode(encoding))
        assert render_main([str(path)]) == 0
        assert "kind: PyTorchJob" in capsys.readouterr().out
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(manifest.replace("grpo-run", "grpo-run # café").encode("latin-1"))
    assert render_main([str(latin)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {latin}: not UTF-8 text")

    run_file = tmp_path / "run config.yaml"
    run_file.write_bytes(
        codecs.BOM_UTF16_LE + "algorithm: sft\ndataset:\n  source: builtin://arithmetic\n".encode("utf-16-le")
    )
    assert load_run_config([f"recipe={run_file}"]).algorithm == "sft"


@pytest.mark.parametrize(
    ("argv", "env", "namespaces", "scope"),
    [
        ([], "", (), ["--all-namespaces"]),
        ([], "team-a, team-b", ("team-a", "team-b"), ["--namespace", "team-a", "--namespace", "team-b"]),
        (["-n", "team-c"], "team-a", ("team-c",), ["--namespace", "team-c"]),
        (["-A"], "team-a", (), ["--all-namespaces"]),  # -A wins: children are then watched everywhere too
    ],
)
def test_the_operator_watches_runs_and_children_in_the_same_namespaces(monkeypatch, argv, env, namespaces, scope):
    """kopf watches the runs where the command line says; the operator's informer watches their children where its
    settings say: the two come from one decision."""
    from atlas_operator.cli import operator_command

    monkeypatch.setenv("ATLAS_WATCH_NAMESPACES", env)
    settings, command = operator_command([*argv, "--verbose"])
    assert settings.watch_namespaces == namespaces
    start = command.index("--log-format=plain") + 1
    assert command[start : start + len(scope)] == scope
    assert command[start + len(scope)] == "--verbose"  # kopf's own options pass through
    assert "--all-namespaces" not in command[start + len(scope) :]


def test_the_operators_subcommands_need_no_training_library(tmp_path):
    """`atlas render` and `atlas operator --help` with atlas_core, torch and transformers unimportable: what the
    operator image has (it installs only the `operator` extra)."""
    blocker = (
        "import sys\n"
        "class Blocked:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('atlas_core', 'torch', 'transformers', 'trl'):\n"
        "            raise ImportError(f'{name} is not in the operator image')\n"
        "sys.meta_path.insert(0, Blocked())\n"
        "from atlas_cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    example = REPO / "examples" / "teacher-run.yaml"
    rendered = subprocess.run(
        [PYTHON, "-c", blocker, "render", str(example)], capture_output=True, text=True, env=python_env(), timeout=120
    )
    assert rendered.returncode == 0, rendered.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert "PyTorchJob" in kinds and "ConfigMap" in kinds
    helped = subprocess.run(
        [PYTHON, "-c", blocker, "operator", "--help"], capture_output=True, text=True, env=python_env(), timeout=120
    )
    assert helped.returncode == 0, helped.stderr
    assert "is not in the operator image" not in helped.stderr
