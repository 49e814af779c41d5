"""The one place the operator uses kopf's private API: its list-then-watch stream (``kopf._cogs.clients``), which kopf
offers no public entry to, and the JSON decoder that stream uses. Checked when imported, so that a kopf upgrade that
moves or changes them fails the operator's start with one clear line instead of a watch that silently stops (kopf is
pinned in constraints.txt)."""

from __future__ import annotations

import inspect
import json

import kopf
import orjson

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
    from kopf._cogs.clients import api as _api
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
    decoder = getattr(getattr(_api, "json", None), "loads", None)  # the standard library's, or ours (a reload)
    if decoder not in (json.loads, orjson.loads) or "json.loads(" not in inspect.getsource(_api.stream):
        raise ImportError(_UPGRADE.format(what="api.stream() no longer decodes each watch event with its json.loads"))


class OrjsonDecoder:
    """What kopf's ``api`` module sees as ``json``: its watch-stream decodes every event of every watch with
    ``json.loads``, and orjson's takes about half the standard library's time — the decoding of the watches was the
    largest share of the operator's CPU when runs come by the hundred (bench/operator_throughput.py). Every watch
    event is JSON the API server wrote (no NaN, integers within 64 bits), which both decode alike."""

    loads = staticmethod(orjson.loads)


_check()
_api.json = OrjsonDecoder  # type: ignore[assignment]  # the module attribute kopf's stream reads at each event
infinite_watch = _watching.infinite_watch  # list, then watch from the list's resourceVersion, forever
Bookmark = _watching.Bookmark  # Bookmark.LISTED: the end of a (re)listing
APINotFoundError = _errors.APINotFoundError  # the resource is not served (its CRD is not installed)
APIForbiddenError = _errors.APIForbiddenError  # the operator may not list it (its RBAC)
