"""atlas_operator: the Kubernetes operator (kopf) that turns AtlasTraining / AtlasTeacher runs into
Kubeflow PyTorchJobs and vLLM rollout servers.

Types → builders → loops, as in Kubebuilder projects:

- pure (no cluster needed): ``spec`` (the API types, spec and status; the CRDs are generated from them
  by ``crd``/``generate``, with ``schema``), ``render`` (the children of a run), ``presets`` (Accelerate
  and DeepSpeed), ``status`` (phase, conditions, progress, the status patch of a reconciliation);
- cluster-facing: ``kube`` (API calls), ``reconcile`` (parse → render → apply → observe), ``handlers``
  (kopf, each handler a few lines), ``config`` (the one settings object), ``metrics``, ``cli``.

Shared names, ports, rules and defaults come from ``atlas_contract``; this package never imports
``atlas_core``.
"""

from importlib import metadata as _metadata

try:  # one version for the operator's User-Agent and the operator-version annotation on what it renders
    __version__ = _metadata.version("atlas-k8s")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
