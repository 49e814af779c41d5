"""Ownership, as Kubernetes controllers decide it (``metav1.IsControlledBy``): a run writes or deletes only the objects
whose controller owner reference is the run itself, by uid.

An object that stands under one of a run's child names and is not the run's (someone's ConfigMap, another team's
job, a child of an earlier run of the same name still being collected) is never patched, replaced, adopted or
deleted: the run reports it (``ChildrenReady=False``, reason ``NameConflict``) and creates nothing until it is gone.
When the object is controlled by a run of the other kind with the same name (an AtlasTraining and an AtlasTeacher
``x`` both want ``x``, ``x-config``, ...), the run that came second is refused (``Invalid``, reason ``NameTaken``):
the two kinds share one set of child names, so that existing runs keep theirs across upgrades.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_contract.names import KINDS


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference with ``controller: true`` (an object has at most one), or None."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller")), None)


def is_controlled_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether ``owner`` (a run's body) is ``obj``'s controller: same uid, as ``metav1.IsControlledBy`` compares.
    An owner without a uid (a manifest never stored by an API server) matches by kind and name."""
    ref = controller_of(obj)
    if ref is None:
        return False
    meta = owner.get("metadata") or {}
    if meta.get("uid"):
        return bool(ref.get("uid") == meta["uid"])
    return ref.get("kind") == owner.get("kind") and ref.get("name") == meta.get("name")


@dataclass(frozen=True)
class Foreign:
    """An object under a child's name that the run does not control."""

    kind: str
    name: str
    controller: dict[str, Any] | None  # its controller owner reference, if any

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Foreign:
        return cls(obj.get("kind") or "object", (obj.get("metadata") or {}).get("name") or "", controller_of(obj))

    def controlled_by(self) -> str:
        if self.controller is None:
            return "no controller: made by someone else"
        ref = self.controller
        return f"controlled by {ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})"

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.controlled_by()})"


def rival_run(foreign: list[Foreign], run_kind: str, run_name: str) -> dict[str, Any] | None:
    """The controller reference of a run of the other kind with the same name, when it holds one of the names."""
    for item in foreign:
        ref = item.controller or {}
        if ref.get("kind") in KINDS and ref.get("kind") != run_kind and ref.get("name") == run_name:
            return ref
    return None


def conflict_message(foreign: list[Foreign]) -> str:
    return (
        "objects with this run's child names exist and are not this run's: "
        + "; ".join(str(item) for item in foreign)
        + ". The operator leaves them as they are and creates no child until they are gone (rename the run, or "
        "delete or rename them); the run then goes on by itself"
    )


def name_taken_message(rival: dict[str, Any], run_kind: str, namespace: str) -> str:
    return (
        f"metadata.name: {rival.get('kind')} {namespace}/{rival.get('name')} already uses this name, and an "
        f"AtlasTraining and an AtlasTeacher of one namespace share their child names ({rival.get('name')}, "
        f"{rival.get('name')}-config, ...); rename this {run_kind} (it starts by itself once "
        f"{rival.get('kind')} {rival.get('name')} and its children are gone)"
    )
