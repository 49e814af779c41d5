"""What the tests (tests/) and the benchmarks (bench/) both run against: the in-process Kubernetes API emulator
(kube_emulator.py, label_selectors.py), stand-in servers (judge_server.py: an OpenAI-compatible judge; vllm_standin.py:
a ``vllm`` command that answers at once), the S3-compatible server's session and access log (s3.py), the runs'
manifests (manifests.py), polling (polling.py) and the environment of a subprocess running our code (env.py). Neither
shipped nor imported by the packages; it never imports tests/ (lint-imports)."""
