"""A researcher's home page (the console's index for a user who is not staff): what they came for, on one screen.

- **Your sessions**: their live sessions, queued ones included (``sessions.selectors.live_sessions_of``): phase, GPU
  model and share, where (cluster, node), cost so far and credits per hour (the session list's and page's figures),
  when a running session's time limit ends it or a queued one's position and estimated start, Open and Stop (the
  session page's own actions, POSTed with the CSRF token).
- **Credits**: ``billing.selectors.account_summary`` (the *My credits* figures: balance, available, burn per hour and
  the runway at that burn).
- **Free now**: ``billing.selectors.free_gpus_by_model`` (the Start session form's "free now" over the clusters the
  user's policy allows) with each model's price per GPU-hour.
- **Start session**: the Start session form's URL.

Every figure comes from the apps' selectors; this module only words them (the template lays them out), in a fixed
number of queries whatever the number of sessions (``tests/console/test_home.py``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal

from django.urls import reverse

from billing import pricing
from billing.admission import policy_for
from billing.selectors import account_summary, free_gpus_by_model
from console.dashboard import utc
from console.figures import credits_display
from sessions.models import Session
from sessions.permissions import SessionRights
from sessions.selectors import LiveSession, live_sessions_of

#: At most this many sessions are listed (the rest are on My sessions, which the section links to).
HOME_SESSIONS_SHOWN = 20


def hours_text(hours: Decimal) -> str:
    """A duration as a person plans with it: ``45 min``, ``3.5 h``, ``26 h``, ``4 days``."""
    if hours < 1:
        return f"{max(int(hours * 60), 0)} min"
    if hours < 10:
        return f"{hours.quantize(Decimal('0.1')).normalize():f} h"
    if hours < 48:
        return f"{int(hours)} h"
    return f"{int(hours // 24)} days"


def share_text(session: Session) -> str:
    """What the session takes of its GPUs: ``2 whole GPUs``, ``1 × 4096 MiB, 25% cores`` (a share of each GPU: a part
    left out is all of it, as HAMi gives it and ``billing.pricing`` prices it)."""
    if session.whole_gpus:
        return f"{session.gpus} whole GPU{'s' if session.gpus != 1 else ''}"
    memory = f"{session.gpu_memory_mib} MiB" if session.gpu_memory_mib is not None else "all memory"
    cores = f"{session.gpu_cores}% cores" if session.gpu_cores is not None else "all cores"
    return f"{session.gpus} × {memory}, {cores}"


@dataclass(frozen=True)
class HomeSession:
    """One row of *Your sessions*, worded.

    Attributes:
        live: the selector's row (session, cost so far, credits per hour, GPU models).
        queued: whether it waits in the queue.
        models: ``NVIDIA A10`` (held), ``H100 or A100 (asked)`` before placement, or ``any model``.
        where: ``lab-c1 / gpu-node-1``, ``lab-c1`` before a node is known, ``-`` without a cluster.
        when: ``ends 2026-12-07 18:00 UTC`` / ``no time limit`` (admitted), ``#3 in the queue · starts about …`` (queued).
        open_url, stop_url: the session's Open / Stop actions, or "" when they are not offered now.
        page_url: the session's page.
    """

    live: LiveSession
    queued: bool
    models: str
    where: str
    when: str
    open_url: str
    stop_url: str
    page_url: str

    @property
    def session(self) -> Session:
        """The ``Session``."""
        return self.live.session

    @property
    def share(self) -> str:
        """:func:`share_text` of the session."""
        return share_text(self.live.session)

    @property
    def cost_text(self) -> str:
        """The cost so far as a person reads it (``console.figures.credits_display``)."""
        return credits_display(self.live.cost_so_far)

    @property
    def rate_text(self) -> str:
        """Credits per hour as a person reads them."""
        return credits_display(self.live.credits_per_hour)


@dataclass(frozen=True)
class Home:
    """What :func:`researcher_home` gathers for the template.

    Attributes:
        sessions: the rows of *Your sessions* (at most :data:`HOME_SESSIONS_SHOWN`).
        sessions_total: how many live sessions the user has in all (more than ``sessions`` when some are not listed).
        credits: ``billing.selectors.account_summary``.
        runway: ``credits last until … (about 3.5 h)``, or "—" when nothing burns.
        free: ``billing.selectors.free_gpus_by_model`` rows.
        start_url, sessions_url, credits_url: the Start session form, My sessions, My credits.
        now_display: the moment the page was read (UTC, minutes).
    """

    sessions: list[HomeSession]
    sessions_total: int
    credits: dict
    runway: str
    free: list[dict]
    start_url: str
    sessions_url: str
    credits_url: str
    now_display: str

    @property
    def more_sessions(self) -> int:
        """How many live sessions are not listed (see My sessions)."""
        return self.sessions_total - len(self.sessions)


def _models_text(live: LiveSession) -> str:
    if not live.gpu_models:
        return "any model"
    text = " or ".join(live.gpu_models)
    return text if live.holds_gpus else f"{text} (asked)"


def _where_text(session: Session) -> str:
    if session.cluster is None:
        return "-"
    return f"{session.cluster.name} / {session.node}" if session.node else session.cluster.name


def _when_text(session: Session) -> str:
    if session.phase == Session.Phase.QUEUED:
        position = f"#{session.queue_position} in the queue" if session.queue_position else "in the queue"
        start = f"starts about {utc(session.estimated_start)}" if session.estimated_start else "start not estimated yet"
        return f"{position} · {start}"
    return f"ends {utc(session.ends_at)}" if session.ends_at else "no time limit"


def _runway(summary: dict, now: datetime.datetime) -> str:
    until = summary["credits_last_until"]
    if until is None:
        return "—"
    hours = Decimal(max((until - now).total_seconds(), 0)) / 3600
    return f"until {utc(until)} (about {hours_text(hours)})"


def researcher_home(request, *, site_name: str, now: datetime.datetime) -> Home:
    """The home page of ``request.user`` (a researcher), read at ``now``.

    Args:
        site_name: the admin site's name (its URL namespace).
        now: an aware UTC datetime: the runway counts from it.

    Returns:
        A :class:`Home`. A constant number of queries (nine today), whatever the number of sessions.
    """
    user = request.user
    prices = pricing.prices_by_model()
    policy = policy_for(user)  # read once: the holds and the clusters whose free GPUs count
    lives, total = live_sessions_of(user=user, limit=HOME_SESSIONS_SHOWN, prices=prices)
    rights = SessionRights(user, may_stop=True)  # a researcher stops their own sessions (the list's rule)
    rows = []
    for live in lives:
        session = live.session
        actions = rights.actions(session)
        rows.append(HomeSession(
            live=live,
            queued=session.phase == Session.Phase.QUEUED,
            models=_models_text(live),
            where=_where_text(session),
            when=_when_text(session),
            open_url=reverse(f"{site_name}:gpu_sessions_session_open", args=[session.pk]) if actions.open else "",
            stop_url=reverse(f"{site_name}:gpu_sessions_session_stop", args=[session.pk]) if actions.stop else "",
            page_url=reverse(f"{site_name}:gpu_sessions_session_change", args=[session.pk]),
        ))
    summary = account_summary(user, now=now, prices=prices, policy=policy)
    return Home(
        sessions=rows,
        sessions_total=total,
        credits=summary,
        runway=_runway(summary, now),
        free=free_gpus_by_model(user, prices, policy=policy),
        start_url=reverse(f"{site_name}:gpu_sessions_session_start"),
        sessions_url=reverse(f"{site_name}:gpu_sessions_session_changelist"),
        credits_url=reverse(f"{site_name}:billing_creditaccount_changelist"),
        now_display=utc(now),
    )
