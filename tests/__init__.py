"""The test suite, a package so that its support code imports as ``tests.support`` (from pytest and scripts run from
the repository root); by tier: unit/, cluster/, emulator/, training/, kube/ (docs/development.md#tests)."""
