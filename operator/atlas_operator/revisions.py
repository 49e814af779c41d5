"""A running workload changes only when its user changed the run: never because the operator was upgraded, or one of
its settings (a default image, a network setting) changed.

Each pinned child (the job, the server Deployments, the run's ConfigMap: what a running trainer or server is made
from) records the run revision it was rendered from: the run's ``metadata.generation`` and a hash of the run's spec
as the API server holds it (for a job, ``suspend`` left out: the job's controller applies it in place, while the
server Deployments follow it with their replicas). A pinned child is rendered again only when both moved past what
it records: the generation alone also moves when a job's ``suspend`` is toggled, the spec alone when a new CRD
version defaults a field. New runs, and children rendered again for a spec change, get the operator's current
rendering. Services and NetworkPolicies restart nothing and always follow the current rendering (a drift is patched
back).

A child made before these annotations existed is taken as rendered from the run's ``status.observedGeneration``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from atlas_contract.names import OPERATOR_VERSION_ANNOTATION, RUN_GENERATION_ANNOTATION, RUN_SPEC_HASH_ANNOTATION
from atlas_operator import __version__, backends

PINNED_KINDS = frozenset({*backends.BACKENDS, "Deployment", "ConfigMap"})
# Spec fields a child's controller applies in place (no restart, no new rendering), by child kind: every job's suspend.
IN_PLACE_FIELDS = {kind: ("suspend",) for kind in backends.BACKENDS}


@dataclass(frozen=True)
class Revision:
    """The run's revision now (its generation and spec), and the generation its status says was last reconciled."""

    generation: int | None
    spec: dict[str, Any]
    observed_generation: int | None = None
    # False while the run keeps a job its spec no longer describes (SpecApplied=False): no child records this revision
    applied: bool = True

    @classmethod
    def of(cls, body: dict[str, Any]) -> Revision:
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        return cls(meta.get("generation"), dict(body.get("spec") or {}), status.get("observedGeneration"))

    def spec_hash(self, kind: str) -> str:
        """The run's spec, as stored, without the fields a child of ``kind`` applies in place."""
        skipped = IN_PLACE_FIELDS.get(kind, ())
        kept = {key: value for key, value in self.spec.items() if key not in skipped}
        return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def annotations(self, kind: str) -> dict[str, str]:
        stamped = {RUN_SPEC_HASH_ANNOTATION: self.spec_hash(kind), OPERATOR_VERSION_ANNOTATION: __version__}
        if self.generation is not None:
            stamped[RUN_GENERATION_ANNOTATION] = str(self.generation)
        return stamped

    def changed_since(self, child: dict[str, Any]) -> bool:
        """Whether the run's user changed its spec (what matters to ``child``) since ``child`` was rendered."""
        annotations = (child.get("metadata") or {}).get("annotations") or {}
        recorded = annotations.get(RUN_GENERATION_ANNOTATION)
        generation = int(recorded) if recorded and recorded.isdigit() else self.observed_generation
        if generation is None or self.generation is None:
            return True  # nothing recorded, no status yet: compare the rendering, as for any first reconciliation
        if self.generation <= generation:
            return False
        recorded_hash = annotations.get(RUN_SPEC_HASH_ANNOTATION)
        return recorded_hash is None or recorded_hash != self.spec_hash(child.get("kind") or "")

    def is_recorded_on(self, child: dict[str, Any]) -> bool:
        """Whether ``child`` records this revision (the operator version aside), or need not (not ``applied``)."""
        if not self.applied:
            return True
        annotations = (child.get("metadata") or {}).get("annotations") or {}
        wanted = self.annotations(child.get("kind") or "")
        return all(annotations.get(k) == v for k, v in wanted.items() if k != OPERATOR_VERSION_ANNOTATION)


def stamp(child: dict[str, Any], revision: Revision) -> dict[str, Any]:
    """``child`` with the revision it is rendered from recorded (pinned kinds only)."""
    if child.get("kind") in PINNED_KINDS:
        meta = child.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), **revision.annotations(child["kind"])}
    return child
