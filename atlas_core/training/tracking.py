"""Experiment tracking on rank 0: MLflow and W&B through TRL's ``report_to`` (atlas_contract/tracking.py).

``install_tracking`` swaps transformers' ``MLflowCallback`` and ``WandbCallback`` (what ``report_to`` adds) for the
subclasses below, and adds MLflow when ``MLFLOW_TRACKING_URI`` is set (a local ``atlas train``, ``atlas demo``):

- :class:`MLflowTracking` logs through MLflow's own client (``MlflowClient``) from a thread of its own, so a server
  that does not answer never slows a step: the steps wait, in order, and are logged when it is back; the end of
  training waits for them at most ``FLUSH_WAIT_S``. One MLflow run per Atlas run: found again by its ``atlas.uid``
  tag on every resume, and a resumed run logs only the steps after the last one the tracking run holds (each step
  once, in order). Metric names are the Prometheus names; the params are run.yaml's settings, the spec's (a cluster
  run's ``tracking`` section) and the library versions. While it answers or not, ``atlas_tracking_up`` and
  ``atlas_tracking_run_info`` say so on the trainer's ``/metrics`` (the operator's condition Tracking).
- :class:`WandbTracking` logs the same names to W&B; a W&B failure is a warning, never the run's end.

After training, :meth:`MLflowTracking.finish` (finish.py) adds the evaluation table as metrics, the artifacts
(metrics.jsonl, the curves, the model card) and the exported model's URI, and ends the tracking run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from transformers.integrations import MLflowCallback, WandbCallback

from atlas_contract import tracking
from atlas_contract.names import ENV_RUN_UID
from atlas_contract.run_config import RunConfig

logger = logging.getLogger(__name__)

#: The libraries whose versions a tracked run records (``versions.<name>`` params).
VERSIONED = ("atlas-k8s", "torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "mlflow-skinny", "wandb")
_FINISHED = "FINISHED"
MAX_METRICS_PER_REQUEST = 1000  # MLflow's log_batch limit


def mlflow_requested(args: Any) -> bool:
    """MLflow is on: ``report_to`` names it, or ``MLFLOW_TRACKING_URI`` is set (the library's own switch)."""
    return tracking.MLFLOW in _report_to(args) or bool(os.environ.get(tracking.ENV_MLFLOW_URI))


def _report_to(args: Any) -> list[str]:
    value = getattr(args, "report_to", None) or []
    return [value] if isinstance(value, str) else list(value)


def install_tracking(trainer: Any, run: RunConfig) -> MLflowTracking | None:
    """Replace the reporting callbacks ``report_to`` added with ours; the MLflow one, when on."""
    args = trainer.args
    if tracking.WANDB in _report_to(args):
        trainer.remove_callback(WandbCallback)
        trainer.add_callback(WandbTracking())
    if not mlflow_requested(args):
        return None
    trainer.remove_callback(MLflowCallback)
    callback = MLflowTracking(run, labels=metric_labels(args, run.run_name))
    if trainer.is_world_process_zero():  # ready before the first step (rank 0 logs)
        callback.logger = MLflowLogger.for_run(run, callback.labels)
    trainer.add_callback(callback)
    return callback


def metric_labels(args: Any, run_name: str) -> dict[str, str]:
    """The run's labels on the trainer's /metrics (an Atlas config's ``metric_labels()``), for the tracking gauges."""
    labels = getattr(args, "metric_labels", None)
    return labels() if callable(labels) else {"namespace": "local", "run": run_name, "kind": "local"}


def log_wandb_summary(evaluation: dict[str, Any] | None) -> None:
    """The evaluation table into the W&B run's summary, when a W&B run is open (rank 0, report_to wandb)."""
    if not evaluation:
        return
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is None:
        return
    try:
        wandb.run.summary.update(tracking.evaluation_metrics(evaluation))
    except Exception as exc:  # noqa: BLE001 - tracking never fails a run
        logger.warning("tracking: W&B did not take the evaluation (%s)", _one_line(exc))


def run_uid(run: RunConfig) -> str:
    """The Atlas run's uid: the cluster run's metadata.uid (tags, env), else one kept in the output folder."""
    uid = (run.tracking.tags.get(tracking.TAG_UID) if run.tracking else None) or os.environ.get(ENV_RUN_UID)
    if uid:
        return uid
    path = Path(run.output_dir) / tracking.LOCAL_UID_FILE
    try:
        return path.read_text().strip()
    except OSError:
        uid = str(uuid.uuid4())
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(uid)
        os.replace(staging, path)
        return uid


def tracked_params(run: RunConfig) -> dict[str, str]:
    """run.yaml's settings (``run.*``), the cluster run's spec, image and backend (its ``tracking`` section), and
    the versions of the libraries that trained it."""
    config = run.to_dict()
    config.pop("tracking", None)
    params = tracking.flatten(config, "run")
    if run.tracking is not None:
        params.update(run.tracking.params)
    return {**params, **library_versions()}


def library_versions() -> dict[str, str]:
    """``versions.<name>`` of each installed library in VERSIONED."""
    versions = {}
    for name in VERSIONED:
        try:
            versions[f"versions.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def tracked_tags(run: RunConfig) -> dict[str, str]:
    tags = dict(run.tracking.tags) if run.tracking is not None else {}
    tags.setdefault(tracking.TAG_NAME, run.run_name)
    tags.setdefault(tracking.TAG_KIND, "local")
    tags[tracking.TAG_UID] = run_uid(run)
    return tags


class MLflowTracking(MLflowCallback):
    """transformers' MLflowCallback, logging from a thread of its own (see the module's docstring)."""

    def __init__(self, run: RunConfig, labels: dict[str, str] | None = None):
        super().__init__()
        self.run = run
        self.labels = labels or {"namespace": "local", "run": run.run_name, "kind": "local"}
        self.logger: MLflowLogger | None = None

    def setup(self, args, state, model):
        self._initialized = True
        if state.is_world_process_zero and self.logger is None:
            self.logger = MLflowLogger.for_run(self.run, self.labels)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)
        if self.logger is not None and logs:
            self.logger.log_step(state.global_step, tracking.step_metrics(logs, state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        # The last steps logged before the process moves on (a stop on SIGTERM exits next) while the server answers;
        # one that does not is not waited for here: finish() tries it once more. The tracking run stays open.
        if self.logger is not None and self.logger.up:
            self.logger.flush(tracking.FLUSH_WAIT_S)

    def on_save(self, args, state, control, **kwargs):
        pass  # checkpoints stay on the run's volume; the final model is exported by spec.output


class WandbTracking(WandbCallback):
    """transformers' WandbCallback with the Prometheus names, and a W&B failure a warning, never the run's end."""

    def setup(self, args, state, model, **kwargs):
        try:
            super().setup(args, state, model, **kwargs)
        except Exception as exc:  # noqa: BLE001 - tracking never stops training
            logger.warning("tracking: W&B did not start (%s); training goes on without it", _one_line(exc))
            self._wandb = None

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if self._wandb is None or not logs:
            return
        if not self._initialized:
            self.setup(args, state, model)
        if self._wandb is None or not state.is_world_process_zero:
            return
        try:
            self._wandb.log(tracking.step_metrics(logs, state.global_step))
        except Exception as exc:  # noqa: BLE001
            logger.warning("tracking: W&B did not take step %s (%s)", state.global_step, _one_line(exc))

    def on_train_end(self, args, state, control, **kwargs):
        try:
            super().on_train_end(args, state, control, **kwargs)
        except Exception as exc:  # noqa: BLE001
            logger.warning("tracking: W&B's end of training failed (%s)", _one_line(exc))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class MLflowLogger:
    """The MLflow run of one Atlas run, written from one thread: steps queued in order, then the tasks of the end
    (evaluation, artifacts, end of run). A failure marks the server down and the same work is tried again after
    ``RETRY_INTERVAL_S``; nothing waits on it but :meth:`flush`, bounded."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        uid: str,
        params: dict[str, str],
        tags: dict[str, str],
        labels: dict[str, str],
    ):
        self.uri, self.experiment, self.run_name, self.uid = uri, experiment, run_name, uid
        self.params, self.tags, self.labels = params, tags, labels
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.logged_through = -1  # the last step the tracking run already held when it was opened (a resume)
        self.up: bool | None = None
        self.error: str | None = None
        self._steps: deque[tuple[int, int, dict[str, float]]] = deque()
        self._tasks: deque[Callable[[Any], None]] = deque()
        self._busy = False
        self._failures = 0  # attempts that failed so far (flush returns at the next one)
        self._condition = threading.Condition()
        self._retry_at = 0.0
        # MLflow's client and entities imported and built here, before training: their import is a second of CPU that
        # the logging thread would otherwise take from the first steps.
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param  # noqa: F401 - imported for the thread

        self._client = MlflowClient(tracking_uri=uri)
        self._thread = threading.Thread(target=self._loop, name="atlas-mlflow", daemon=True)
        self._thread.start()

    @classmethod
    def for_run(cls, run: RunConfig, labels: dict[str, str]) -> MLflowLogger:
        uid = run_uid(run)
        return cls.from_environment(run.run_name, uid, tracked_params(run), tracked_tags(run), labels)

    @classmethod
    def from_environment(
        cls, run_name: str, uid: str, params: dict[str, str], tags: dict[str, str], labels: dict[str, str]
    ) -> MLflowLogger:
        """A logger to MLflow's own MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME, its requests bounded
        (REQUEST_TIMEOUT_S, REQUEST_MAX_RETRIES) unless the user set MLflow's variables."""
        import mlflow

        os.environ.setdefault(tracking.ENV_MLFLOW_TIMEOUT, str(tracking.REQUEST_TIMEOUT_S))
        os.environ.setdefault(tracking.ENV_MLFLOW_RETRIES, str(tracking.REQUEST_MAX_RETRIES))
        return cls(
            uri=os.environ.get(tracking.ENV_MLFLOW_URI) or mlflow.get_tracking_uri(),
            experiment=os.environ.get(tracking.ENV_MLFLOW_EXPERIMENT) or "Default",
            run_name=run_name,
            uid=uid,
            params=params,
            tags=tags,
            labels=labels,
        )

    # ------------------------------------------------------------------ what the trainer calls

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        with self._condition:
            if len(self._steps) >= tracking.MAX_PENDING_STEPS:
                dropped = self._steps.popleft()
                waiting = len(self._steps)
                logger.warning("tracking: %d steps wait for %s; step %s dropped", waiting, self.uri, dropped[0])
            self._steps.append((step, int(time.time() * 1000), metrics))
            self._condition.notify()

    def add_task(self, task: Callable[[Any], None]) -> None:
        """``task(client)`` after every step queued so far (the run is open when it runs)."""
        with self._condition:
            self._tasks.append(task)
            self._condition.notify()

    def flush(self, timeout: float) -> bool:
        """Log everything queued now: one attempt at once (a server that did not answer is not waited out until its
        next retry), returning when all is logged, when that attempt failed, or after ``timeout`` seconds; whether
        all was logged. What is left stays queued (a later flush tries again)."""
        deadline = time.monotonic() + timeout
        with self._condition:
            failures = self._failures
            self._retry_at = 0.0
            self._condition.notify_all()
            while (self._steps or self._tasks or self._busy) and self._failures == failures:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
            if self._steps or self._tasks:
                logger.warning(
                    "tracking: %s has not taken %d steps and %d tasks; training does not wait for them",
                    self.uri,
                    len(self._steps),
                    len(self._tasks),
                )
                return False
        return True

    def finish(
        self,
        evaluation: dict[str, Any] | None,
        artifacts: list[Path],
        step: int,
        output_uri: str | None = None,
    ) -> dict[str, str] | None:
        """After training: the evaluation table (as metrics at ``step``), the artifacts and the exported model's URI,
        then the run ended; waits at most FLUSH_WAIT_S. The run's ``{runId, url}`` for the result (None when the
        server never answered)."""
        from mlflow.entities import Metric

        def finish_run(client: Any) -> None:
            now = int(time.time() * 1000)
            values = tracking.evaluation_metrics(evaluation or {})
            if values and set(values) <= set(client.get_run(self.run_id).data.metrics):
                values = {}  # a re-run that only retries its export: the evaluation is logged once
            metrics = [Metric(key, value, now, step) for key, value in values.items()]
            tags = []
            if output_uri:
                from mlflow.entities import RunTag

                tags.append(RunTag(tracking.TAG_OUTPUT, output_uri))
            if metrics or tags:
                client.log_batch(self.run_id, metrics=metrics, tags=tags)
            for path in artifacts:
                if path.is_file():
                    client.log_artifact(self.run_id, str(path))
            client.set_terminated(self.run_id, _FINISHED)

        self.add_task(finish_run)
        self.flush(tracking.FLUSH_WAIT_S)
        return self.reference()

    @property
    def thread_cpu_s(self) -> float:
        """CPU seconds the logging thread has used so far (bench/tracking.py reports it): what tracking takes from
        training's cores."""
        ident = self._thread.ident
        assert ident is not None  # started in __init__
        return time.clock_gettime(time.pthread_getcpuclockid(ident))

    def reference(self) -> dict[str, str] | None:
        if self.run_id is None:
            return None
        url = tracking.run_url(self.uri, self.experiment_id or "0", self.run_id)
        return {"runId": self.run_id, **({"url": url} if url else {})}

    # ------------------------------------------------------------------ the logging thread

    def _loop(self) -> None:
        client = self._client
        while True:
            with self._condition:
                while not (self._steps or self._tasks) or time.monotonic() < self._retry_at:
                    wait = self._retry_at - time.monotonic() if (self._steps or self._tasks) else None
                    self._condition.wait(wait)
                self._busy = True
            try:
                self._work(client)
            except Exception as exc:  # noqa: BLE001 - a tracking failure is said and retried, never raised
                self._mark(False, _one_line(exc))
                with self._condition:
                    self._retry_at = time.monotonic() + tracking.RETRY_INTERVAL_S
                    self._failures += 1
            else:
                self._mark(True)
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()

    def _work(self, client: Any) -> None:
        """Open the run when it is not yet, then log the queued steps in order (up to MLflow's 1000 metrics a
        request), then the tasks; each item leaves the queue once the server took it."""
        if self.run_id is None:
            self._open(client)
        while True:
            with self._condition:
                batch: list[tuple[int, int, dict[str, float]]] = []
                size = 0
                for item in self._steps:
                    if batch and size + len(item[2]) > MAX_METRICS_PER_REQUEST:
                        break
                    batch.append(item)
                    size += len(item[2])
                task = self._tasks[0] if not batch and self._tasks else None
            if batch:
                self._log_steps(client, batch)
                with self._condition:
                    for _ in batch:
                        self._steps.popleft()
            elif task is not None:
                task(client)
                with self._condition:
                    self._tasks.popleft()
            else:
                return

    def _log_steps(self, client: Any, batch: list[tuple[int, int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException

        fresh = [(step, at, values) for step, at, values in batch if step > self.logged_through]
        metrics = [Metric(key, value, at, step) for step, at, values in fresh for key, value in values.items()]
        if not metrics:
            return
        try:
            client.log_batch(self.run_id, metrics=metrics)
        except MlflowException as exc:
            status = exc.get_http_status_code()
            if 400 <= status < 500 and status not in (408, 429):  # refused as sent: retrying would block every step
                logger.warning("tracking: MLflow refused steps %s-%s: %s", fresh[0][0], fresh[-1][0], _one_line(exc))
                return
            raise

    def _open(self, client: Any) -> None:
        """The experiment (made when missing), and the run of this uid: found (a resume: its last step read), or
        made; the params it does not hold yet."""
        from mlflow.entities import Param, RunStatus

        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment else _create_experiment(client, self.experiment)
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{tracking.TAG_UID}` = '{self.uid}'",
            max_results=1,
            order_by=["attributes.start_time ASC"],
        )
        if found:
            run_id = found[0].info.run_id
            history = client.get_metric_history(run_id, tracking.STEP_METRIC)
            self.logged_through = max((int(m.step) for m in history), default=-1)
            held = found[0].data.params
            if found[0].info.status != RunStatus.to_string(RunStatus.RUNNING):
                client.update_run(run_id, status="RUNNING")
        else:
            run_id = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags).info.run_id
            held = {}
        new = [Param(k, v) for k, v in self.params.items() if k not in held]
        for start in range(0, len(new), 100):  # MLflow takes at most 100 params a request
            client.log_batch(run_id, params=new[start : start + 100])
        self.experiment_id, self.run_id = experiment_id, run_id
        logger.info(
            "tracking: MLflow run %s at %s%s",
            run_id,
            self.uri,
            f" (resumed after step {self.logged_through})" if self.logged_through >= 0 else "",
        )

    def _mark(self, up: bool, error: str | None = None) -> None:
        from atlas_core.telemetry import metrics

        if up != self.up:
            if up:
                logger.info("tracking: MLflow at %s answers", self.uri)
            else:
                logger.warning(
                    "tracking: MLflow at %s does not answer (%s); training goes on, its steps are logged when it is "
                    "back",
                    self.uri,
                    error,
                )
        self.up, self.error = up, error
        metrics.tracking_up.labels(**self.labels, backend=tracking.MLFLOW).set(1 if up else 0)
        reference = self.reference()
        if reference is not None:
            labels = dict(self.labels, backend=tracking.MLFLOW, run_id=reference["runId"], url=reference.get("url", ""))
            metrics.tracking_run_info.labels(**labels).set(1)


def _create_experiment(client: Any, name: str) -> str:
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name)
    except MlflowException:  # made by another run in between
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def track_evaluation(
    names: dict[str, str], settings: dict[str, Any], report: dict[str, Any], files: list[Path]
) -> dict[str, str] | None:
    """``atlas eval``'s table as an MLflow run of its own when ``MLFLOW_TRACKING_URI`` is set: the models, dataset
    and settings as params, the table as ``atlas_eval_*`` metrics, ``files`` (eval.json, problems.jsonl) as
    artifacts. Its ``{runId, url}``, or None (no tracking, or its server did not answer within FLUSH_WAIT_S)."""
    if not os.environ.get(tracking.ENV_MLFLOW_URI):
        return None
    params = {**tracking.flatten(names, "eval"), **tracking.flatten(settings, "eval.settings"), **library_versions()}
    uid = str(uuid.uuid4())  # every evaluation is a run of its own
    logger_ = MLflowLogger.from_environment(
        f"eval {Path(names.get('teacher', 'teacher')).name}",
        uid,
        params,
        {tracking.TAG_UID: uid, tracking.TAG_KIND: "eval", tracking.TAG_NAME: names.get("teacher", "")},
        {"namespace": "local", "run": "eval", "kind": "local"},
    )
    return logger_.finish(report, files, 0)
