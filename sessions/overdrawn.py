"""Stopping the sessions of accounts that ran out of credits: a sessions workflow that reacts to billing's state.

Billing keeps the balances and the policies' grace (``billing.admission``); stopping a session is the session service's
(``sessions.lifecycle.session_stop``). Sessions sits above billing, so this workflow lives here and reads billing,
never the other way (``.importlinter``'s layers).

Lock order: credit accounts (primary-key order) → session rows (see ``billing.admission`` for admission's).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from billing.admission import EffectivePolicy, credits_text, policies_for
from billing.models import CreditAccount
from contract.rfc3339 import format_utc
from sessions import lifecycle
from sessions.models import Session

logger = logging.getLogger(__name__)

#: Phases a session is stopped from by ``overdrawn_sessions_stop`` (Stopping ones are on their way already).
_STOPPABLE_EXCLUDED = (*Session.TERMINAL_PHASES, Session.Phase.STOPPING)


def _past_grace(account: CreditAccount, policy: EffectivePolicy, now: datetime) -> bool:
    return (account.balance - account.accrued < 0 and account.below_zero_since is not None
            and account.below_zero_since + timedelta(seconds=policy.grace_seconds) <= now)


def stop_reason(*, account: CreditAccount, policy: EffectivePolicy) -> str:
    """The message written on a session stopped because its owner's credits ran out."""
    unbilled = f"; it counts {credits_text(account.accrued)} credits of usage not billed yet" if account.accrued else ""
    return (f"Stopped: credits ran out (balance {credits_text(account.balance - account.accrued)} since "
            f"{format_utc(account.below_zero_since)}, grace {policy.grace_seconds} s{unbilled}). Ask an operator for a grant of "
            "credits, then start a new session.")


def overdrawn_sessions_stop(*, now: datetime | None = None) -> int:
    """Stop the live sessions of every account below zero for longer than its owner's policy grace: ``balance −
    accrued`` (the usage of open billing periods counts, to the sample) below zero since ``below_zero_since``.

    Each session is stopped through ``sessions.lifecycle.session_stop`` (Stopping now, its GShareSession
    deleted by the task, then Terminated) with ``stop_reason`` as its message. Idempotent: sessions already
    Stopping or ended are left alone, so a second run changes nothing. The accounts found are locked (primary-key
    order) and checked again before their sessions are stopped, so a grant that just brought one back to zero or
    above is seen. Queries: four, plus what ``session_stop`` does per session; none grows with the number of
    accounts.

    Args:
        now: the time to compare with (default: now).

    Returns:
        How many sessions were stopped.
    """
    now = now or timezone.now()
    stoppable = Session.objects.filter(owner_id=OuterRef("user_id")).exclude(phase__in=_STOPPABLE_EXCLUDED)
    overdrawn = list(
        CreditAccount.objects.filter(balance__lt=F("accrued"), below_zero_since__isnull=False).filter(Exists(stoppable))
        .only("pk", "user_id", "balance", "accrued", "below_zero_since")
    )
    if not overdrawn:
        return 0
    policies = policies_for(user_ids=[a.user_id for a in overdrawn])
    due = [a.pk for a in overdrawn if _past_grace(a, policies[a.user_id], now)]
    if not due:
        return 0
    stopped = 0
    with transaction.atomic():
        accounts = {
            a.user_id: a
            for a in CreditAccount.objects.select_for_update().filter(pk__in=due).order_by("pk")
            if _past_grace(a, policies[a.user_id], now)
        }
        sessions = Session.objects.filter(owner_id__in=list(accounts)).exclude(phase__in=_STOPPABLE_EXCLUDED).order_by("pk")
        for session in sessions:
            account = accounts[session.owner_id]
            reason = stop_reason(account=account, policy=policies[session.owner_id])
            if lifecycle.session_stop(session=session, reason=reason, stop_reason=Session.StopReason.CREDITS).phase == Session.Phase.STOPPING:
                stopped += 1
                logger.info("session %s of %s stopped: balance %s (accrued %s) below zero since %s", session.public_id,
                            account.user_id, account.balance, account.accrued, format_utc(account.below_zero_since))
    return stopped
