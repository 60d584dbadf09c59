"""Read queries for billing: accounts, holds and burn rate, the ledger.

Costs per hour follow ``billing.admission`` (one definition with admission): a session costs, per hour, the sum over
its reserved GPUs of ``share × price`` of that GPU's model (``billing.pricing``; each term rounded to 0.000001
credits), and a live session without reservations ``gpus × share × the default price``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from billing import admission, pricing
from billing.models import CREDITS, Accrual, CreditAccount, LedgerEntry
from clusters.models import Cluster, GpuDevice
from clusters.selectors import gpu_model_availability

_ZERO = Decimal(0).quantize(CREDITS)


def account_of(user) -> CreditAccount:
    """``user``'s credit account, or an unsaved one with a zero balance when they have none yet (reads create nothing)."""
    return CreditAccount.objects.filter(user_id=user.pk).first() or CreditAccount(user=user, balance=_ZERO, accrued=_ZERO)


def session_hourly_cost(session, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Credits per hour ``session`` costs: Σ over its reserved GPUs of ``share × price`` of the GPU's model (each
    term rounded to 0.000001 credits); with no reservation, ``gpus × share × the default price`` (a shared request's
    share then counts the whole GPU when it asks for memory: ``pricing.gpu_share`` with an unknown device).

    Args:
        session: a ``sessions.models.Session``; prefetch ``allocations__device`` when pricing many (else two queries each).
        prices: a ``pricing.prices_by_model()`` result to reuse; None reads it (one query).
    """
    if prices is None:
        prices = pricing.prices_by_model()
    allocations = list(session.allocations.all())
    if not allocations:
        share = pricing.gpu_share(device_memory_mib=None, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
        return session.gpus * pricing.hourly_cost(price=pricing.price_for_model("", prices), share=share)
    total = _ZERO
    for allocation in allocations:
        device = allocation.device
        share = pricing.gpu_share(device_memory_mib=device.memory_mib, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
        total += pricing.hourly_cost(price=pricing.price_for_model(device.model, prices), share=share)
    return total


def burn_rate(user, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Credits per hour ``user``'s Running sessions cost now (Σ ``session_hourly_cost``). Three queries at most."""
    if prices is None:
        prices = pricing.prices_by_model()
    running = user.gpu_sessions.running().order_by("pk").with_devices()
    return sum((session_hourly_cost(s, prices) for s in running), _ZERO)


def account_holds(user) -> Decimal:
    """Credits ``user``'s live sessions hold: ``billing.admission.session_holds`` (Σ hourly cost of the live — not
    Terminated or Failed — sessions × the policy's ``min_balance_hours``, rounded up to 0.000001)."""
    return admission.session_holds(user)


def credits_last_until(*, balance: Decimal, accrued: Decimal, burn_per_hour: Decimal, now: datetime) -> datetime | None:
    """When ``balance − accrued`` runs out at ``burn_per_hour`` credits per hour from ``now`` (the account's runway).

    Holds are not subtracted: they are a margin admission keeps for new sessions, not credits the running sessions
    spend; the stop at zero (``sessions.overdrawn``) judges ``balance − accrued``, so this is when it would stop them
    if nothing else changed.

    Args:
        balance, accrued: credits (``Decimal``).
        burn_per_hour: credits per hour the Running sessions cost now (``burn_rate``).
        now: an aware UTC datetime.
    Returns:
        An aware datetime (whole seconds, rounded down; ``now`` when nothing is left), or None when nothing burns.
    """
    if burn_per_hour <= 0:
        return None
    left = balance - accrued
    if left <= 0:
        return now
    seconds = (left * 3600 / burn_per_hour).to_integral_value(rounding=ROUND_FLOOR)
    try:
        return now + timedelta(seconds=int(seconds))
    except OverflowError:  # beyond year 9999: as good as never
        return None


def account_summary(user, *, now: datetime | None = None, prices: dict[str, Decimal] | None = None,
                    policy: admission.EffectivePolicy | None = None) -> dict:
    """``{"user", "balance", "accrued", "holds", "available", "burn_rate_per_hour", "credits_last_until",
    "below_zero_since"}`` for ``user`` (``accrued``: usage of open billing periods, not charged yet; ``available`` =
    balance − accrued − holds, what admission judges; ``credits_last_until``: :func:`credits_last_until`; credits as
    ``Decimal``). A constant number of queries.

    Args:
        now: the time the runway counts from (default ``timezone.now()``).
        prices: a ``pricing.prices_by_model()`` result to reuse; None reads it (one query).
        policy: ``user``'s ``admission.policy_for`` to reuse; None reads it (one query).
    """
    account = account_of(user)
    if prices is None:
        prices = pricing.prices_by_model()
    holds = admission.session_holds(user, policy=policy, prices=prices)
    burn = burn_rate(user, prices)
    return {
        "user": user.get_username(),
        "balance": account.balance,
        "accrued": account.accrued,
        "holds": holds,
        "available": account.balance - account.accrued - holds,
        "burn_rate_per_hour": burn,
        "credits_last_until": credits_last_until(balance=account.balance, accrued=account.accrued, burn_per_hour=burn,
                                                 now=now or timezone.now()),
        "below_zero_since": account.below_zero_since,
    }


def price_list() -> dict:
    """The price of every GPU model the fleet has, for researchers (``GET /api/v1/prices``, the console's price list).

    Returns:
        ``{"default_credits_per_gpu_hour": Decimal, "models": [{"model", "credits_per_gpu_hour", "priced_as",
        "memory_mib", "gpus", "free_gpus", "clusters"}, ...]}``, models by name. ``priced_as`` is ``"model"`` when the
        model has its own price, ``"default"`` when the default applies; ``memory_mib`` is the smallest registered
        memory of the model's GPUs (MiB, as HAMi registers it); ``gpus`` the healthy GPUs of that model on clusters
        that are not deregistered, ``free_gpus`` those with no reservation; ``clusters`` their names. A session's
        price per hour is this price × its share of each GPU (``billing.pricing``). Three queries.
    """
    prices = pricing.prices_by_model()
    rows = (
        GpuDevice.objects.exclude(cluster__status=Cluster.Status.DEREGISTERED)
        .values("model")
        .annotate(memory_mib=Min("memory_mib"), gpus=Count("id", filter=Q(health=True)),
                  free_gpus=Count("id", filter=Q(health=True, used_count=0)))
        .order_by("model")
    )
    clusters: dict[str, set[str]] = {}
    for model, name in (GpuDevice.objects.exclude(cluster__status=Cluster.Status.DEREGISTERED)
                        .values_list("model", "cluster__name").distinct()):
        clusters.setdefault(model, set()).add(name)
    return {
        "default_credits_per_gpu_hour": pricing.price_for_model("", prices),
        "models": [
            {
                "model": row["model"],
                "credits_per_gpu_hour": pricing.price_for_model(row["model"], prices),
                "priced_as": "model" if row["model"] in prices else "default",
                "memory_mib": row["memory_mib"],
                "gpus": row["gpus"],
                "free_gpus": row["free_gpus"],
                "clusters": sorted(clusters.get(row["model"], ())),
            }
            for row in rows
        ],
    }


def free_gpus_by_model(user, prices: dict[str, Decimal] | None = None, *, policy: admission.EffectivePolicy | None = None) -> list[dict]:
    """What ``user`` could start on now, per GPU model: the Start session form's figure
    (``clusters.selectors.gpu_model_availability``) over the clusters ``user``'s policy allows (``allowed_clusters``;
    all when it names none), with each model's price.

    Args:
        prices: a ``pricing.prices_by_model()`` result to reuse; None reads it (one query).
        policy: ``user``'s ``admission.policy_for`` to reuse; None reads it (one query).

    Returns:
        ``[{"model", "free", "total", "credits_per_gpu_hour"}, ...]`` by model: ``total`` the healthy GPUs on ready
        nodes of connected clusters with a session domain, ``free`` those with nothing reserved (whole GPUs a session
        could take now), the price a ``Decimal`` (``pricing.price_for_model``). One to three queries.
    """
    if prices is None:
        prices = pricing.prices_by_model()
    allowed = (policy or admission.policy_for(user)).allowed_clusters
    return [
        {"model": model, "free": free, "total": total, "credits_per_gpu_hour": pricing.price_for_model(model, prices)}
        for model, free, total in gpu_model_availability(cluster_ids=allowed)
    ]


def _ledger_entries() -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.select_related("account__user", "session")


def ledger_entry(*, pk: int) -> LedgerEntry:
    """One ledger entry with account, user and session joined (raises ``LedgerEntry.DoesNotExist``)."""
    return _ledger_entries().get(pk=pk)


def ledger_list(
    *, user, session: str | None = None, since: datetime | None = None, until: datetime | None = None, username: str | None = None
) -> QuerySet[LedgerEntry]:
    """Ledger entries of ``user`` (staff: of ``username`` when given), newest first, with account, user and
    session joined.

    Args:
        session: only entries of this session (``ses_...``).
        since: only entries written at or after this time.
        until: only entries written before this time.
        username: staff only: this user's entries instead of the caller's (ignored for others).
    """
    qs = _ledger_entries().order_by("-id")
    if user.is_staff and username:
        qs = qs.filter(account__user__username=username)
    else:
        qs = qs.filter(account__user_id=user.pk)
    if session:
        qs = qs.filter(session__public_id=session)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    return qs


def accrual_list(*, user, session: str | None = None, username: str | None = None) -> QuerySet[Accrual]:
    """The open accruals (usage of a billing period not charged yet) of ``user``'s sessions (staff: of ``username``
    when given), by session, with the session joined.

    Args:
        session: only this session's (``ses_...``).
        username: staff only: this user's instead of the caller's (ignored for others).
    """
    qs = Accrual.objects.filter(samples__gt=0).select_related("session").order_by("session_id")
    if user.is_staff and username:
        qs = qs.filter(account__user__username=username)
    else:
        qs = qs.filter(account__user_id=user.pk)
    if session:
        qs = qs.filter(session__public_id=session)
    return qs
