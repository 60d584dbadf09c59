"""What the console shows of a session's GPU activity and the idle policy (the session page's Activity section, the
list's Activity column): read side only, built from ``SessionActivity`` (``sessions.activity``), the connections
not flushed yet (``sessions.activity.connections_pending``) and the owner's policy (``billing.admission``).

The rules are the policy's own: ``sessions.idle.activity_unknown`` says whether a reading counts, the session page's
warning is ``sessions.idle.idle_status`` now (what the stop task acts on), the list's is
``SessionActivity.idle_since``/``stops_at`` as ``sessions.idle.idle_enforce`` wrote them, and "idle" in the list is
``sessions.selectors.idle_sessions`` (annotated by ``console_selectors.with_activity``). Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings

from billing import admission
from console.dashboard import age
from sessions import activity as session_activity
from sessions.idle import activity_unknown, gpus_unreported, idle_status
from sessions.models import Session, SessionActivity

GIB = 1024 ** 3


def utc(value: datetime | None) -> str:
    """``2026-12-01 11:40:05 UTC`` (empty for None)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def gib_text(value: int | None) -> str:
    """Bytes as GiB with one decimal (``12.5``), or ``?`` when unknown."""
    if value is None:
        return "?"
    return str((Decimal(value) / GIB).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def policy_minute_seconds() -> int:
    """How many seconds a policy minute lasts here (``GSHARE_IDLE_POLICY_MINUTE_SECONDS``, 60 unless shortened)."""
    return int(settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS)


def policy_text(policy: admission.EffectivePolicy, *, owner: str) -> str:
    """``bob's own policy: 60 min without a GPU kernel, warned 15 min before`` (the policy minute's length in seconds
    when it is not 60); ``never stops idle sessions`` for a timeout of 0."""
    whose = f"{owner}'s own policy" if policy.source == "user" else "the default policy"
    if policy.idle_timeout_minutes <= 0:
        return f"{whose}: never stops idle sessions"
    minute = policy_minute_seconds()
    unit = "min" if minute == 60 else f"policy minutes of {minute} s"
    warning = min(policy.idle_warning_minutes, policy.idle_timeout_minutes)
    return f"{whose}: {policy.idle_timeout_minutes} {unit} without a GPU kernel, warned {warning} {unit} before"


@dataclass(frozen=True)
class GpuReading:
    """One GPU of the last reading, as the session page's table shows it.

    Attributes:
        device_uuid: the GPU's UUID.
        last_kernel: ``12 s ago`` (as of the reading), ``no kernel seen`` when the monitor saw none.
        utilization: SM utilization, percent (None: not reported).
        memory: ``12.5 / 40.0 GiB`` (used of the session's limit; ``?`` where a number is missing).
        sampled_at: when this GPU was read (UTC text).
    """

    device_uuid: str
    last_kernel: str
    utilization: float | None
    memory: str
    sampled_at: str

    @property
    def utilization_text(self) -> str:
        """``87 %`` or ``—``."""
        return "—" if self.utilization is None else f"{round(self.utilization)} %"


def _gpu_reading(gpu: dict) -> GpuReading:
    seconds = gpu.get("last_kernel_seconds")
    sampled = gpu.get("sampled_at")
    try:
        sampled_text = utc(datetime.fromisoformat(sampled)) if sampled else ""
    except (TypeError, ValueError):
        sampled_text = str(sampled)
    return GpuReading(
        device_uuid=str(gpu.get("device_uuid", "")),
        last_kernel="no kernel seen" if seconds is None else f"{age(seconds)} ago",
        utilization=gpu.get("utilization_percent"),
        memory=f"{gib_text(gpu.get('memory_used_bytes'))} / {gib_text(gpu.get('memory_limit_bytes'))} GiB",
        sampled_at=sampled_text,
    )


def mean_utilization(gpus: list[dict]) -> int | None:
    """The mean SM utilization (percent, rounded) over the GPUs of a reading that report one, or None."""
    values = [g["utilization_percent"] for g in gpus or [] if isinstance(g, dict) and g.get("utilization_percent") is not None]
    return round(sum(values) / len(values)) if values else None


def _row(session: Session) -> SessionActivity | None:
    try:
        return session.activity
    except Session.activity.RelatedObjectDoesNotExist:
        return None


@dataclass(frozen=True)
class ActivityView:
    """The session page's Activity section (:func:`activity_view`).

    Attributes:
        state: ``ok`` (the GPU monitor was read and the reading is fresh), ``unknown`` (``reason`` says why: the
            operator could not read it, or the reading is stale) or ``none`` (no reading yet).
        reason: why GPU activity does not count now ("" for ``ok``).
        sampled_at: the last reading's time (UTC text, "" before one).
        gpus: one :class:`GpuReading` per GPU of the last reading.
        last_kernel_at: newest kernel seen on any of its GPUs (UTC text, "" when none).
        last_connected_at: newest connection let in, including ones not flushed yet (UTC text, "" when none).
        idle_since, stops_at: while the policy's warning runs on a Running session (UTC text), else ""
            (``sessions.idle.idle_status`` at ``now``).
        connections_count: connections keep the session (GPU activity of some GPU is not known); False when only a
            GPU kernel does.
        partial: why connections count although a reading exists ("" otherwise).
        postponed: a connection during the warning postponed the stop already (it happens once).
        policy: the owner's idle policy in words (:func:`policy_text`).
        exempt_until, exempt_reason, exempt_by: a running staff exemption (UTC text), else "".
        stop_reason: the session's ``stop_reason`` in words ("" while it was not asked to stop).
        stopped_idle: it was stopped by the idle policy (``message`` then says why).
    """

    state: str
    reason: str
    sampled_at: str
    gpus: list[GpuReading] = field(default_factory=list)
    last_kernel_at: str = ""
    last_connected_at: str = ""
    idle_since: str = ""
    stops_at: str = ""
    connections_count: bool = True
    partial: str = ""
    postponed: bool = False
    policy: str = ""
    exempt_until: str = ""
    exempt_reason: str = ""
    exempt_by: str = ""
    stop_reason: str = ""
    stopped_idle: bool = False

    @property
    def warning(self) -> bool:
        """The idle policy's warning runs: the session stops at :attr:`stops_at` unless a GPU kernel runs (or, while
        :attr:`connections_count`, someone connects)."""
        return bool(self.stops_at)


def activity_view(session: Session, *, now: datetime, pending: dict[str, datetime] | None = None,
                  policy: admission.EffectivePolicy | None = None) -> ActivityView:
    """The Activity section of ``session`` at ``now``.

    Args:
        session: with ``activity`` joined or not (then one query) and ``owner`` (its name names the policy).
        now: the moment shown (aware UTC).
        pending: ``connections_pending`` for it, when read already; None reads it (one Redis call, live sessions only).
        policy: the owner's effective policy, when read already; None reads it (one query).

    Returns:
        An :class:`ActivityView`.
    """
    row = _row(session)
    if pending is None:
        pending = (session_activity.connections_pending([session.public_id]) if session.is_live else None) or {}  # None: Redis down
    if policy is None:
        policy = admission.policy_for(session.owner)
    connected = session_activity.last_connection(row, pending, session.public_id)
    state = row.state if row else ""
    unknown = activity_unknown(state=state, reason=row.reason if row else "", sampled_at=row.sampled_at if row else None, now=now)
    shown_state = "none" if not state or row.sampled_at is None else ("unknown" if unknown else "ok")
    live = session.is_live
    judgement = idle_status(session=session, row=row, policy=policy, connected=connected, now=now)
    exempt = row is not None and row.exempt_until is not None and row.exempt_until > now and live
    return ActivityView(
        state=shown_state,
        reason=unknown,
        sampled_at=utc(row.sampled_at) if row else "",
        gpus=[_gpu_reading(g) for g in (row.gpus if row else []) if isinstance(g, dict)],
        last_kernel_at=utc(row.last_kernel_at) if row else "",
        last_connected_at=utc(connected),
        idle_since=utc(judgement.idle_since),
        stops_at=utc(judgement.stops_at),
        connections_count=judgement.connections_count,
        partial=judgement.partial,
        postponed=judgement.postponed,
        policy=policy_text(policy, owner=session.owner.get_username()),
        exempt_until=utc(row.exempt_until) if exempt else "",
        exempt_reason=row.exempt_reason if exempt else "",
        exempt_by=row.exempt_by if exempt else "",
        stop_reason=session.get_stop_reason_display() if session.stop_reason else "",
        stopped_idle=session.stop_reason == Session.StopReason.IDLE,
    )


@dataclass(frozen=True)
class ActivitySummary:
    """The list's Activity cell: ``kind`` (``idle``, ``warned``, ``busy``, ``unknown``, ``none``, ``ended``),
    ``text`` (``idle · stops 14:05``, ``busy 87 %``, ``unknown``) and ``title`` (the longer sentence on hover)."""

    kind: str
    text: str
    title: str = ""


def activity_summary(session: Session, *, now: datetime) -> ActivitySummary:
    """The list's Activity cell of ``session`` (no query: ``activity`` joined and ``is_idle`` annotated by
    ``console_selectors.with_activity``).

    A live session in the policy's warning says when it stops; a Running one that ``idle_sessions`` calls idle
    says for how long it has been quiet; one whose GPU activity does not count says ``unknown`` (the reason on
    hover); the rest ``busy`` with the mean SM utilization of its GPUs. An ended session stopped by the policy says so.
    """
    row = _row(session)
    if not session.is_live:
        if session.stop_reason == Session.StopReason.IDLE:
            return ActivitySummary("ended", "stopped idle", session.message)
        return ActivitySummary("ended", "—")
    if row is not None and row.stops_at is not None and row.idle_since is not None:
        return ActivitySummary("warned", f"idle · stops {row.stops_at.astimezone(UTC):%H:%M}",
                               f"GPUs idle since {utc(row.idle_since)}; stops at {utc(row.stops_at)} unless a GPU kernel runs")
    if session.phase != Session.Phase.RUNNING:
        return ActivitySummary("none", "—")
    unknown = activity_unknown(state=row.state if row else "", reason=row.reason if row else "",
                               sampled_at=row.sampled_at if row else None, now=now)
    if unknown:
        return ActivitySummary("unknown" if row and row.state else "none", "unknown" if row and row.state else "no reading", unknown)
    if getattr(session, "is_idle", False):
        counts = bool(gpus_unreported(gpus=row.gpus, devices=session.devices, count=session.gpus))
        signals = (session.started_at, row.last_kernel_at) + ((row.last_connected_at,) if counts else ())
        last = max((t for t in signals if t is not None), default=now)
        quiet = age((now - last).total_seconds())
        said = "no GPU kernel and no connection" if counts else "no GPU kernel"
        return ActivitySummary("idle", f"idle {quiet}", f"{said} since {utc(last)}")
    mean = mean_utilization(row.gpus)
    return ActivitySummary("busy", "busy" if mean is None else f"busy {mean} %",
                           f"last reading {utc(row.sampled_at)}" + (f"; SM utilization {mean} % (mean of its GPUs)" if mean is not None else ""))
