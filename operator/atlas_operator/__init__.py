"""atlas_operator: the Kubernetes operator (kopf) that turns AtlasTraining / AtlasTeacher runs into
Kubeflow PyTorchJobs and vLLM rollout servers.

Pure modules (no cluster needed): ``spec`` (API types), ``render`` (children), ``status`` (phase,
conditions, progress), ``crd``/``generate``. Cluster-facing: ``kube`` (API calls), ``reconcile``,
``handlers`` (kopf), ``cli``.
"""
