"""atlas_operator: the Kubernetes operator (kopf) that turns AtlasTraining / AtlasTeacher runs into
the job of their backend (atlas_operator/backends/) and vLLM rollout servers.

Types → builders → loops, as in Kubebuilder projects:

- pure (no cluster needed): ``spec`` and ``run_status`` (the API types of spec and status, condition types and
  Event reasons; the CRDs are generated from them by ``crd``/``generate``, with ``schema``), ``validation`` (a
  manifest → a run, every problem named; the CEL rules it shares with the CRDs in ``cel_rules``), ``render`` (the
  children of a run, a module per object family), ``presets`` (Accelerate and DeepSpeed), ``status_update`` (phase,
  conditions, progress: the status patch and Events of a reconciliation), and the policies of what may be written:
  ``ownership`` (only what the run controls) and ``revisions`` (a running job changes only when its user changed the
  run);
- cluster-facing: ``kube`` (API calls), ``informer`` (the children, watched), ``reconcile`` (parse → render → apply
  → observe: a Reconciler composed of one object per step, and what is remembered per run), ``handlers`` (kopf,
  each handler a few lines), ``config`` (the one settings object), ``metrics``, ``cli``.

Shared names, ports, rules and defaults come from ``atlas_contract``; this package never imports
``atlas_core``.
"""

from importlib import metadata as _metadata

try:  # one version for the operator's User-Agent and the operator-version annotation on what it renders
    __version__ = _metadata.version("atlas-k8s")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
