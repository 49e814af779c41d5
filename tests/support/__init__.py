"""What the tests stand on, apart from the tests themselves: one Kubernetes API emulator (kube_emulator, on kmock),
one label-selector matcher, the operator's test cluster and run manifests with the objects and statuses the
operator reads, set by hand (no controller of ours: the real ones run in tests/kube/), and stand-ins for judges,
the vLLM server and Prometheus. Import as ``tests.support.<module>`` with the repository root on ``sys.path``
(pytest puts it there; bench/ scripts run as ``python -m bench.<script>``)."""
