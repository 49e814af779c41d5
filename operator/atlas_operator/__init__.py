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
