"""Shared fixtures: the offline tiny model (built once per session), a warmed-up copy, the trainer metrics
cleared, a real S3-compatible server (``s3_server``, harness/s3.py) and a real MLflow tracking server
(``mlflow_server``, tests/support/mlflow.py). Helpers the tests import are in tests/support/ and, those the
benchmarks share, in harness/ (env.py: REPO, PYTHON, free_port, python_env; polling.py: wait_for)."""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


@pytest.fixture(scope="session")
def atlas_cache(tmp_path_factory) -> Path:
    """A private model cache, also handed to subprocesses through ATLAS_CACHE_DIR."""
    cache = tmp_path_factory.mktemp("atlas-cache")
    os.environ["ATLAS_CACHE_DIR"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(atlas_cache) -> Path:
    from atlas_core.models.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def warm_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model after a short SFT warm-up on the bundled task (answers in \\boxed{})."""
    from datasets import Dataset

    from atlas_core.tasks.arithmetic import make_sft_dataset
    from atlas_core.training.algorithms.sft import SFTConfig, SFTTrainer

    out = tmp_path_factory.mktemp("warm")
    args = SFTConfig(
        output_dir=str(out / "run"),
        model_name_or_path=str(tiny_model_dir),
        max_steps=300,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        logging_steps=50,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = SFTTrainer(args=args, train_dataset=Dataset.from_list(make_sft_dataset(4000, seed=1)))
    trainer.train()
    trainer.save_model(str(out / "model"))
    return out / "model"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (versitygw, make s3) on 127.0.0.1 for the session: ``endpoint``, ``access_key``,
    ``secret_key``, ``region``, ``bucket(name)``, ``env()``, ``client()`` (harness/s3.py)."""
    from harness.s3 import s3_server as start

    yield from start(tmp_path_factory)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (``mlflow server``, SQLite) on 127.0.0.1 for the session: ``uri``, ``client()``,
    ``stop()``, ``start()`` (the same port and store) (tests/support/mlflow.py)."""
    from tests.support.mlflow import mlflow_server as start

    yield from start(tmp_path_factory)


@pytest.fixture
def fresh_trainer_metrics():
    """The trainer registry's labelled series removed (prometheus_client's ``clear()``), so that a test reads only
    what it — or the code it runs — set, never what an earlier test left in the process-wide registry.
    Unlabelled counters cannot be cleared: tests compare them before and after."""
    from prometheus_client.metrics import MetricWrapperBase

    from atlas_core.telemetry import metrics

    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            value.clear()
    return metrics


# make test runs two pytest-xdist workers (-n 2): the tests that time real trainers or wait on a control plane (a
# watchdog's stall, a Prometheus scrape, a SIGTERM's save, the real-Kubernetes tier, whose one control plane is
# package-scoped) are one unit of work, run one after another on one worker; every other module is a unit of its own
# (its module-scoped fixtures start once), run on the other worker beside them, a worker per core: the serial ones
# leave a core idle most of their time. The serial ones: the tier tests/kube/ whole, and the modules of the other
# tiers marked ``pytestmark = pytest.mark.serial``. Without -n this changes nothing.
SERIAL = "serial"
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """tests/kube/ is serial by its tier (``-m serial`` selects it with the marked modules)."""
    for item in items:
        if item.path.is_relative_to(TESTS / "kube"):
            item.add_marker(SERIAL)


@functools.cache
def marked_serial(module: Path) -> bool:
    """Whether the module's own ``pytestmark`` names ``pytest.mark.serial``, read from its source: the scheduler, in
    xdist's controller, sees node ids only, never the items or their markers."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "pytestmark" for target in node.targets):
            return any(isinstance(mark, ast.Attribute) and mark.attr == SERIAL for mark in ast.walk(node.value))
    return False


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: "serial", or its module's path."""
    module = nodeid.split("::", 1)[0]
    path = TESTS.parent / module
    return SERIAL if path.is_relative_to(TESTS / "kube") or marked_serial(path) else module


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        """xdist's scope scheduling (largest unit first, a unit whole to one worker) over work_unit's units (xdist's
        own LoadFileScheduling overrides the same method for files)."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)
