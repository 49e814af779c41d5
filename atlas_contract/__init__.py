"""The contract between the two halves of Atlas: one place for each shared fact.

``atlas_core`` (the trainer, heavy: torch, TRL) and ``atlas_operator`` (kopf, Kubernetes) both import
this package, and neither imports the other (only the thin ``atlas`` CLI sees both). It depends on the
standard library alone, so the operator image and tests import it without any training library.

- :mod:`atlas_contract.errors`   — :class:`InvalidFields`, the one error for "these fields are wrong";
- :mod:`atlas_contract.names`    — API group and kinds, child object names, labels, ports, file names;
- :mod:`atlas_contract.metrics`  — every metric the trainer and the operator export;
- :mod:`atlas_contract.checks`   — TRL's generation-batch rule, reward names and weights, model references;
- :mod:`atlas_contract.defaults` — the trainer defaults an operator run gets when a field is unset;
- :mod:`atlas_contract.teaching` — :class:`TeachingSettings`, the one definition of the teaching protocol's settings;
- :mod:`atlas_contract.run_config` — :class:`RunConfig`, run.yaml typed (what the operator writes, the trainer parses).
- :mod:`atlas_contract.vllm`     — a vLLM server's command line, on GPU (the student server) and on CPU.
"""
