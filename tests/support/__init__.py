"""What the tests stand on, apart from the tests themselves: one Kubernetes API emulator (kube_emulator, on kmock),
one label-selector matcher, the local executors that run the pods of PyTorchJobs and JobSets, the operator's test
cluster and run manifests, and stand-ins for judges and Prometheus. Import as ``tests.support.<module>`` with the
repository root on ``sys.path`` (pytest puts it there; bench/ scripts run as ``python -m bench.<script>``)."""
