"""The session time limit: how long a session may hold its GPUs, the warning before the end, the stop at the end,
and extensions (docs/sessions.md, "Time limits").

* A request may ask ``runtime_hours`` (decimal hours, more than 0, at most the owner's policy ``max_runtime_hours``);
  without it the session gets the policy's maximum. A policy maximum of 0 means no limit: such a session has no
  ``ends_at`` unless it asked for hours.
* ``ends_at`` counts from the reservation (``created_at``), not from the pod's start: the GPUs are held, and billed
  (``billing.held``), from the reservation, so a session whose image takes an hour to pull has used an hour of its time.
  It is known at creation, so whatever plans around the session's end (the queue's estimates) knows it from then.
* ``runtime_warning_minutes`` before ``ends_at`` the session shows ``ends_soon`` (``runtime_warning``); at ``ends_at``
  ``runtime_enforce`` (beat: ``sessions.enforce_runtime``, every 30 s) stops it through ``sessions.lifecycle.session_stop``
  with ``stop_reason`` ``time_limit``.
* ``session_extend`` moves ``ends_at`` later: staff who may manage every session by any amount, the owner only while
  the session's whole time (``ends_at`` - its reservation) stays within the policy's maximum and nobody waits in the
  queue for GPUs like its own. Both are audited.

These are real hours and minutes (the idle policy's ``GSHARE_IDLE_POLICY_MINUTE_SECONDS`` does not shorten them).
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal, InvalidOperation

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Action, audit_record
from billing import admission
from billing.services import MAX_RUNTIME_HOURS, RUNTIME_HOURS_PLACES
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError, Conflict, Forbidden
from sessions import lifecycle
from sessions.errors import EXTEND_FORBIDDEN, NO_TIME_LIMIT, QUEUE_WAITING, RUNTIME_OVER_LIMIT, SESSION_NOT_LIVE
from sessions.models import Session
from sessions.permissions import may_open_any_session

logger = logging.getLogger(__name__)

#: The Celery task that stops the sessions past their time limit (``sessions.tasks`` defines it; beat runs it,
#: ``sessions/migrations/0012``).
ENFORCE_TASK = "sessions.enforce_runtime"

#: Sessions one ``runtime_enforce`` run stops at most (the next run, 30 s later, takes the rest).
ENFORCE_BATCH = 500


#: What a decimal string of hours may look like: ASCII digits, a point, an exponent (``Decimal`` alone would also take
#: ``1_0``, other scripts' digits, ``NaN`` and ``Infinity``).
_DECIMAL = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class InvalidRuntime(ApplicationError):
    """400: ``runtime_hours`` or ``hours`` is not a positive decimal number of hours."""

    code = INVALID_REQUEST
    status = 400


class RuntimeOverLimit(ApplicationError):
    """400: the hours asked take the session past its policy's ``max_runtime_hours``."""

    code = RUNTIME_OVER_LIMIT
    status = 400


def hours_parse(value, *, field: str = "runtime_hours") -> Decimal:
    """A number of hours from a JSON number, a ``Decimal`` or a decimal string (a float only through ``str``, never its
    binary value): finite, more than 0, at most ``MAX_RUNTIME_HOURS`` and at most 2 decimal places (0.01 h = 36 s).

    Raises:
        InvalidRuntime: 400 ``invalid_request`` naming ``field``.
    """
    problem = (f"{field} must be a number of hours more than 0 and at most {MAX_RUNTIME_HOURS}, with at most "
               f"{RUNTIME_HOURS_PLACES} decimal places, e.g. 8 or 1.5")
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal, str)):
        raise InvalidRuntime(problem + ".")
    text = value.strip() if isinstance(value, str) else str(value)
    if len(text) > 32 or not _DECIMAL.fullmatch(text):
        raise InvalidRuntime(problem + ".")
    try:
        hours = Decimal(text)
    except (InvalidOperation, ValueError):
        raise InvalidRuntime(problem + ".") from None
    if not hours.is_finite() or not 0 < hours <= MAX_RUNTIME_HOURS:
        raise InvalidRuntime(problem + ".")
    if hours != hours.quantize(Decimal(1).scaleb(-RUNTIME_HOURS_PLACES)):
        raise InvalidRuntime(problem + ".")
    return hours


def hours_delta(hours: Decimal) -> timedelta:
    """``hours`` (at most 2 decimal places, so whole seconds) as a ``timedelta``."""
    return timedelta(seconds=int(hours * 3600))


def runtime_ends_at(*, policy, start: datetime, hours: Decimal | None) -> datetime | None:
    """When a session reserved at ``start`` must end.

    Args:
        policy: its owner's ``EffectivePolicy``.
        start: its reservation (aware).
        hours: the ``runtime_hours`` asked (``hours_parse``), or None for the policy's maximum.

    Returns:
        ``start`` + the hours, or None when neither the request nor the policy sets a limit.

    Raises:
        RuntimeOverLimit: 400 ``runtime_over_limit``: more hours than the policy's ``max_runtime_hours``.
    """
    limit = policy.max_runtime_hours
    if hours is None:
        return start + hours_delta(limit) if limit else None
    if limit and hours > limit:
        raise RuntimeOverLimit(f"runtime_hours {hours} is over your policy's limit of {limit} hours per session (max_runtime_hours): "
                               f"ask for at most {limit}.", extra={"max_runtime_hours": str(limit)})
    return start + hours_delta(hours)


def runtime_warning(*, session: Session, policy, now: datetime) -> bool:
    """Whether ``session`` shows its coming stop: it is live and not stopping already, has a time limit, and ``now`` is
    within the policy's ``runtime_warning_minutes`` of it (or past it, until the stop)."""
    if session.ends_at is None or not session.offers_stop:
        return False
    return now >= session.ends_at - timedelta(minutes=policy.runtime_warning_minutes)


def runtime_enforce(*, now: datetime | None = None) -> dict[str, int]:
    """Stop every live session past its time limit (``ends_at`` <= ``now``) with ``stop_reason`` ``time_limit``.

    Queries: one to find them (the partial index ``session_live_ends_at_idx``), then per session its lock and what
    ``session_stop`` costs. A session extended since it was found is judged again under its lock and kept.

    Returns:
        ``{"due": sessions found, "stopped": sessions stopped}``.
    """
    now = now or timezone.now()
    due = list(Session.objects.live().exclude(phase=Session.Phase.STOPPING).filter(ends_at__lte=now)
               .order_by("ends_at").values_list("pk", flat=True)[:ENFORCE_BATCH])
    stopped = sum(_stop_at_limit(pk=pk, now=now) for pk in due)
    return {"due": len(due), "stopped": stopped}


@transaction.atomic
def _stop_at_limit(*, pk: int, now: datetime) -> bool:
    locked = Session.objects.select_for_update().select_related("owner").get(pk=pk)
    if not locked.is_live or locked.phase == Session.Phase.STOPPING or locked.ends_at is None or locked.ends_at > now:
        return False
    hours = (locked.ends_at - locked.created_at).total_seconds() / 3600
    message = (f"Stopped at its time limit ({locked.ends_at:%Y-%m-%d %H:%M:%S} UTC, {hours:.2f} hours after it was reserved). "
               "Start a new session to go on; ask for runtime_hours, or extend a session before its end, for more time.")
    lifecycle.session_stop(session=locked, reason=message, stop_reason=Session.StopReason.TIME_LIMIT)
    logger.info("session %s stopped at its time limit %s", locked.public_id, locked.ends_at.isoformat())
    return True


def waiting_for_these_gpus(session: Session) -> int:
    """How many queued sessions could use ``session``'s GPUs: they accept one of its GPUs' models (or any model) and are
    not pinned to another cluster. Two queries."""
    models = sorted(set(session.allocations.values_list("device__model", flat=True)))
    accepts = Q(gpu_models=[])
    for model in models:
        accepts |= Q(gpu_models__contains=[model])
    where = Q(requested_cluster__isnull=True) | Q(requested_cluster_id=session.cluster_id)
    return Session.objects.queued().filter(accepts, where).count()


@transaction.atomic
def session_extend(*, session: Session, user, hours) -> Session:
    """Move ``session``'s time limit ``hours`` later, audited (``session_extend``).

    Staff who may manage every session (``sessions.permissions.may_open_any_session``) may extend by any amount (up
    to ``MAX_RUNTIME_HOURS`` at a time); the owner only while the session's whole time (new ``ends_at`` - ``created_at``)
    stays within their policy's ``max_runtime_hours`` (no bound when that is 0), counted from its reservation (its
    admission, for a session that waited in the queue), and while no queued session waits for GPUs like its own
    (``waiting_for_these_gpus``): the queue's estimates count on its end.

    Args:
        session: a session visible to ``user`` (``sessions.selectors.session_get``).
        user: who asks.
        hours: hours to add (as ``hours_parse``).

    Returns:
        The session with its new ``ends_at``.

    Raises:
        InvalidRuntime: 400 ``invalid_request``.
        RuntimeOverLimit: 400 ``runtime_over_limit`` (the owner, past the policy's maximum).
        Forbidden: 403 ``extend_forbidden``: ``user`` is neither its owner nor staff who may manage every session.
        Conflict: 409 ``session_not_live`` (ended or stopping); 409 ``no_time_limit`` (it has none to extend); 409
            ``queue_waiting`` (the owner, while sessions wait in the queue for GPUs like its own).
    """
    staff = may_open_any_session(user)
    if not staff and session.owner_id != user.pk:
        raise Forbidden("Only the session's owner, or staff who may manage everyone's sessions, can extend it.", code=EXTEND_FORBIDDEN)
    hours = hours_parse(hours, field="hours")
    locked = Session.objects.select_for_update().select_related("owner").get(pk=session.pk)
    if not locked.is_live or locked.phase == Session.Phase.STOPPING:
        raise Conflict(f"Session {locked.public_id} has ended or is stopping; there is nothing to extend.", code=SESSION_NOT_LIVE)
    if locked.ends_at is None:
        raise Conflict(f"Session {locked.public_id} has no time limit; there is nothing to extend.", code=NO_TIME_LIMIT)
    before = locked.ends_at
    after = before + hours_delta(hours)
    if not staff:
        limit = admission.policy_for(locked.owner).max_runtime_hours
        reserved = locked.admitted_at or locked.created_at
        if limit and after - reserved > hours_delta(limit):
            left = max(Decimal(0), Decimal((reserved + hours_delta(limit) - before).total_seconds()) / 3600)
            raise RuntimeOverLimit(
                f"Extending by {hours} hours would take session {locked.public_id} past your policy's limit of {limit} hours from its "
                f"reservation (max_runtime_hours): you may add at most {left.quantize(Decimal('0.01'), rounding=ROUND_DOWN)} hours; "
                "staff may extend it further.", extra={"max_runtime_hours": str(limit)})
        waiting = waiting_for_these_gpus(locked)
        if waiting:
            raise Conflict(f"{waiting} session(s) are waiting in the queue for GPUs like those of {locked.public_id}, and their "
                           "estimated starts count on its time limit: it cannot be extended by its owner now; staff may extend it.",
                           code=QUEUE_WAITING)
    locked.ends_at = after
    locked.save(update_fields=["ends_at"])
    audit_record(action=Action.SESSION_EXTEND, obj=locked, changes={"ends_at": (before, after)},
                 details={"owner": locked.owner.get_username(), "hours": str(hours), "by_staff": staff})
    logger.info("session %s extended by %s h to %s by %s", locked.public_id, hours, after.isoformat(), user.get_username())
    return locked
