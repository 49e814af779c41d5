"""Merge patches of the fields the operator manages: compare what a child has with what the run renders."""

from __future__ import annotations

from typing import Any


def managed_patch(desired: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch of the fields the operator manages (labels, annotations, owner references, spec/data), or
    None when the existing object already has them. Fields the API server adds are not compared."""
    patch: dict[str, Any] = {}
    managed = ("labels", "annotations", "ownerReferences")
    meta = {k: desired["metadata"][k] for k in managed if k in desired.get("metadata", {})}
    if meta and not _contains(existing.get("metadata", {}), meta):
        patch["metadata"] = meta
    for key in ("spec", "data"):
        if key in desired and not _contains(existing.get(key), desired[key]):
            patch[key] = desired[key]
    # A Service's selector is all ours: a key no longer rendered is removed (a merge patch would keep it, and after a
    # spec.backend change the metrics Service would select no pod: both backends' rank-0 labels at once).
    if desired.get("kind") == "Service":
        selector = desired["spec"].get("selector") or {}
        stale = {key: None for key in (existing.get("spec") or {}).get("selector") or {} if key not in selector}
        if stale:
            patch["spec"] = {**patch.get("spec", desired["spec"]), "selector": {**selector, **stale}}
    # A NetworkPolicy is all ours, and a key it does not render narrows it (a matchLabels entry that selects no pod
    # leaves the run's pods open): any difference is drift, and the patch removes what was added.
    if desired.get("kind") == "NetworkPolicy" and existing.get("spec") != desired["spec"]:
        patch["spec"] = _replacing(desired["spec"], existing.get("spec"))
    return patch or None


def _replacing(desired: Any, existing: Any) -> Any:
    """A merge patch that turns ``existing`` into exactly ``desired``: keys ``desired`` lacks are set to null."""
    if not isinstance(desired, dict) or not isinstance(existing, dict):
        return desired
    stale = {key: None for key in existing if key not in desired}
    return {**stale, **{key: _replacing(value, existing.get(key)) for key, value in desired.items()}}


def _contains(actual: Any, wanted: Any) -> bool:
    """``wanted`` is a sub-document of ``actual`` (quantities compared as text: 8 == "8")."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted or (actual is not None and str(actual) == str(wanted))


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386: null deletes a key), as the API server
    applies it; neither argument is changed."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
