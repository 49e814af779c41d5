"""The one place the operator uses kopf's private API: its list-then-watch stream (``kopf._cogs.clients``), which kopf
offers no public entry to. Checked when imported, so that a kopf upgrade that moves or changes it fails the operator's
start with one clear line instead of a watch that silently stops (kopf is pinned in constraints.txt)."""

from __future__ import annotations

import inspect

import kopf

TESTED_KOPF = "1.45.2"  # the version these names and signatures were read from
INSTALLED_KOPF = getattr(kopf, "__version__", "?")
_UPGRADE = (
    f"atlas_operator.kopf_compat: kopf {INSTALLED_KOPF} is not the kopf whose private watch-stream API the informer "
    f"uses (tested with kopf {TESTED_KOPF}): {{what}}; install kopf=={TESTED_KOPF} (constraints.txt) or port "
    "atlas_operator/informer.py"
)
if INSTALLED_KOPF.split(".")[:2] != TESTED_KOPF.split(".")[:2]:  # private modules may change in any minor release
    raise ImportError(_UPGRADE.format(what=f"another minor release ({INSTALLED_KOPF})"))

try:
    from kopf._cogs.clients import errors as _errors
    from kopf._cogs.clients import watching as _watching
except ImportError as exc:  # pragma: no cover - only on a kopf that moved them
    raise ImportError(_UPGRADE.format(what=exc)) from exc


def _check() -> None:
    wanted = {"settings", "resource", "namespace"}
    parameters = set(inspect.signature(_watching.infinite_watch).parameters)
    if not wanted <= parameters:
        raise ImportError(_UPGRADE.format(what=f"infinite_watch() takes {sorted(parameters)}, not {sorted(wanted)}"))
    if not hasattr(_watching.Bookmark, "LISTED"):
        raise ImportError(_UPGRADE.format(what="watching.Bookmark has no LISTED"))
    for name in ("APINotFoundError", "APIForbiddenError"):
        if not isinstance(getattr(_errors, name, None), type):
            raise ImportError(_UPGRADE.format(what=f"errors.{name} is gone"))


_check()
infinite_watch = _watching.infinite_watch  # list, then watch from the list's resourceVersion, forever
Bookmark = _watching.Bookmark  # Bookmark.LISTED: the end of a (re)listing
APINotFoundError = _errors.APINotFoundError  # the resource is not served (its CRD is not installed)
APIForbiddenError = _errors.APIForbiddenError  # the operator may not list it (its RBAC)
