"""A session's lifecycle after its creation (``sessions.create``), in one place.

Scheduled -> ``apply`` (``sessions.apply`` applies its GShareSession) -> Starting -> Running (``status``: the operator's
reports) -> ``stop`` (Stopping, ``sessions.delete`` deletes it) -> Terminated; or Failed (``end``). A routing change of
its cluster re-applies it (``reapply``, subscribed to ``clusters.signals`` by ``subscriptions``). Each task is published
after the commit (``outbox``) and published again by ``reconcile`` when that publish was lost; ``remote`` is the
GShareSession on the cluster.

The names below are the package's public API; ``sessions.tasks`` runs its tasks.
"""

from sessions.lifecycle.apply import session_apply, session_apply_gave_up
from sessions.lifecycle.end import session_fail, session_terminate
from sessions.lifecycle.outbox import publish_after_commit
from sessions.lifecycle.reapply import session_reapply
from sessions.lifecycle.reconcile import sessions_reconcile
from sessions.lifecycle.remote import TransientApplyError
from sessions.lifecycle.status import ReportFromFuture, session_status_apply
from sessions.lifecycle.stop import REDELETE_WINDOW, session_delete_remote, session_stop

__all__ = [
    "REDELETE_WINDOW",
    "ReportFromFuture",
    "TransientApplyError",
    "publish_after_commit",
    "session_apply",
    "session_apply_gave_up",
    "session_delete_remote",
    "session_fail",
    "session_reapply",
    "session_status_apply",
    "session_stop",
    "session_terminate",
    "sessions_reconcile",
]
