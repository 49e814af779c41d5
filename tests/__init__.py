"""The test suite, a package so that its support code imports as ``tests.support`` (from pytest, bench/ and scripts
run from the repository root)."""
