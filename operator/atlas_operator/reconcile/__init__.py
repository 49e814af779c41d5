"""One reconciliation of a run: parse → check prerequisites → render → apply → observe status.

Idempotent by construction: children have fixed names, an existing child is compared with what
the run renders and patched only when it differs, and a 409 on create means "someone made it
first" (a previous operator process, a racing handler) and turns into that comparison. Nothing
here knows about kopf: the handlers hand in ``adopt`` and the previous status, and write what
comes back.

Each module holds one concern: ``reconciler`` (the pass, step by step, and the steps it is composed of),
``prerequisites``, ``children`` (observe, apply, prune and delete the children; who may be touched is
atlas_operator/ownership.py), ``job_policies`` (recreate on a spec change, a queued run's suspend, a backend change),
``observe`` (the job's phase, servers, pods, the result), ``scrape`` (the trainers' metrics), ``memory`` (what is
remembered per run between passes, forgotten at once when it is deleted), ``retry`` (what the run's timer retries),
``concurrency`` (requests sent together), ``patching`` (merge patches), ``relevance`` (which changes of a child
its run's status depends on), ``conditions`` (a condition of a declared type) and ``errors`` (retry later, a name
taken). What differs between backends is asked of atlas_operator/backends/.
"""

from atlas_operator.reconcile.children import reward_yaml
from atlas_operator.reconcile.conditions import condition
from atlas_operator.reconcile.errors import NameConflict, RetryLater
from atlas_operator.reconcile.memory import RunMemory
from atlas_operator.reconcile.observe import MAX_RESULT_READS
from atlas_operator.reconcile.prerequisites import JOB_CRDS
from atlas_operator.reconcile.reconciler import Reconciler
from atlas_operator.reconcile.scrape import fetch_text

__all__ = [
    "JOB_CRDS",
    "MAX_RESULT_READS",
    "NameConflict",
    "Reconciler",
    "RetryLater",
    "RunMemory",
    "condition",
    "fetch_text",
    "reward_yaml",
]
