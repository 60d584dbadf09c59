"""Held GPU time: every second a session held GPUs is billed, whether or not a usage sample fell inside.

A session holds the GPUs placement reserved for it from the moment they were reserved (``Session.created_at``:
``sessions.create`` writes the session and its reservations in one transaction; from then nobody else can be placed
on them) until they are released at its end (``Session.ended_at``). The operator samples only what it sees Running,
once a tick: a session that lives between two ticks has no sample at all, and the first and last seconds of every
session (before its first tick, after its last) have none either. So:

* at the release (``sessions.lifecycle.end``), ``RECORD_RELEASED`` keeps each released reservation as a ``HeldGpu`` row:
  the device, its model and memory, ``held_from`` and ``held_until``;
* once the session ended ``GSHARE_BILLING_SETTLE_SECONDS`` ago (its last samples are in by then),
  :func:`held_gaps_bill` (run by the periodic close, ``billing.periods.periods_close``) writes a ``UsageSample`` with
  ``gap`` set for every stretch of the held interval, on every held GPU, that no stored sample covers, priced as a
  sample is (``billing.pricing``: the device's share and its model's price), and accrues them into the session's open
  period, which the same run then charges. Its ``HeldGpu`` rows get ``billed_at``;
* from then, a usage sample of the session is not stored (``billing.ingest``: it counts in ``duplicates``): each
  of its held seconds is billed already, by a sample or by a gap row, and never twice (``usage_sample_no_overlap``).

Coverage counts GPUs, not names: HAMi may give the Pod other GPUs of the node than placement reserved, and samples
name those. At every instant the session is billed for as many GPUs as it reserved: the reserved GPUs no sample
covers get gap rows, as many as the covered GPUs fall short of the reservation.

Every writer holds the owner's credit account lock (``SELECT ... FOR UPDATE``, primary-key order), as ingestion and
the periodic close do, so a gap is computed from every sample stored before it and no sample is stored after it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

import contract
from billing import periods, pricing
from billing.models import CREDITS, Accrual, CreditAccount, HeldGpu, UsageSample
from clusters.models import GpuDevice

logger = logging.getLogger(__name__)

#: ``sample_id`` prefix of gap rows; ``billing.usage.parse_samples`` refuses it from operators.
GAP_PREFIX = contract.USAGE_RESERVED_ID_PREFIX

#: The sessions' table, reached through billing's own relation (sessions sits above billing).
_SESSION_TABLE = HeldGpu._meta.get_field("session").related_model._meta.db_table

#: Records the reservations a release deletes as ``HeldGpu`` rows: a data-modifying CTE for the release's ``DELETE``
#: (``sessions.lifecycle.end``), which names the deleted rows ``{released}`` with columns ``session_id`` and ``device_id``;
#: the session's ``ended_at`` is already written in the same transaction. One statement with the release.
RECORD_RELEASED = f"""
    INSERT INTO {HeldGpu._meta.db_table} (session_id, device_uuid, gpu_model, memory_mib, held_from, held_until)
    SELECT r.session_id, d.uuid, d.model, d.memory_mib, s.created_at, GREATEST(s.created_at, COALESCE(s.ended_at, now()))
      FROM {{released}} r JOIN {GpuDevice._meta.db_table} d ON d.id = r.device_id JOIN {_SESSION_TABLE} s ON s.id = r.session_id
    ON CONFLICT (session_id, device_uuid) DO NOTHING"""

#: Per session and GPU, the stored samples' windows merged (``range_agg``) and cut to the held interval.
_COVERAGE = f"""
    SELECT u.session_id, u.device_uuid, lower(r), upper(r)
      FROM (SELECT session_id, device_uuid, unnest(range_agg(tstzrange(start, "end", '[)'))) AS r
              FROM {UsageSample._meta.db_table} WHERE session_id = ANY(%s) GROUP BY session_id, device_uuid) u"""


def _due_owners(now: datetime, after: int, limit: int) -> list[int]:
    """Owners (user ids, ascending, above ``after``) of sessions whose held time is due to be billed at ``now``."""
    settle = timedelta(seconds=settings.GSHARE_BILLING_SETTLE_SECONDS)
    return list(
        HeldGpu.objects.filter(billed_at__isnull=True, held_until__lte=now - settle, session__owner_id__gt=after)
        .order_by("session__owner_id").values_list("session__owner_id", flat=True).distinct()[:limit]
    )


def held_gaps_bill(*, now: datetime | None = None, owners_per_transaction: int = 200, max_transactions: int = 100) -> int:
    """Bill the held time no usage sample covered, for every session that ended ``GSHARE_BILLING_SETTLE_SECONDS`` ago.

    Per transaction, the credit accounts of up to ``owners_per_transaction`` owners are locked (primary-key order;
    created when missing), their sessions' unbilled ``HeldGpu`` rows read again under the locks, and for each session:
    the stored samples' coverage of ``[held_from, held_until)`` per GPU (``_COVERAGE``), the uncovered stretches
    (:func:`held_gaps`), one ``gap`` ``UsageSample`` per stretch and GPU (``sample_id`` ``gap:<session id>:<device
    uuid>:<start, epoch µs>``), priced with ``billing.pricing`` as ingestion prices a sample, accrued into the session's
    open period (``Accrual``, created when the session never reported usage; its period is the open one when it holds
    samples, else that of the last gap), and the owner's ``accrued`` and ``below_zero_since`` moved with them. The
    ``HeldGpu`` rows get ``billed_at``. Idempotent: a second run finds nothing due.

    Args:
        now: the time to judge by (default: now).
        owners_per_transaction: owners whose accounts are locked per transaction.
        max_transactions: bound on transactions per call (the next run goes on).

    Returns:
        How many sessions' held time was billed (with or without gaps).
    """
    now = now or timezone.now()
    billed = 0
    after = 0
    for _ in range(max_transactions):
        owners = _due_owners(now, after, owners_per_transaction)
        if not owners:
            break
        after = owners[-1]
        with transaction.atomic():
            billed += _bill_owners(owners, now=now)
    if billed:
        logger.info("held GPU time: %d ended session(s) billed", billed)
    return billed


def held_gaps(*, held_from: datetime, held_until: datetime, reserved: list[str], covered: dict[str, list[tuple[datetime, datetime]]]
              ) -> list[tuple[str, datetime, datetime]]:
    """The stretches of ``[held_from, held_until)`` to bill on reserved GPUs because no sample covers them.

    At every instant the session owes ``len(reserved)`` GPUs; the GPUs samples cover then (reserved or not: HAMi may
    have given the Pod others) count, and the shortfall is billed on the reserved GPUs not covered then, in the order
    of ``reserved``.

    Args:
        held_from, held_until: the held interval (aware datetimes).
        reserved: the UUIDs of the GPUs placement reserved (``HeldGpu.device_uuid``), in billing order.
        covered: per GPU UUID, the stored samples' windows (merged or not, any order; cut to the held interval here).

    Returns:
        ``[(device uuid, start, end)]``: disjoint per GPU, adjacent stretches of one GPU merged, in time order per GPU.
    """
    spans = {uuid: [(max(s, held_from), min(e, held_until)) for s, e in windows if s < held_until and e > held_from]
             for uuid, windows in covered.items()}
    cuts = {held_from, held_until}
    for windows in spans.values():
        for start, end in windows:
            cuts.update((start, end))
    edges = sorted(cuts)
    gaps: dict[str, list[list[datetime]]] = defaultdict(list)
    for left, right in zip(edges, edges[1:], strict=False):
        busy = {uuid for uuid, windows in spans.items() if any(s <= left and right <= e for s, e in windows)}
        missing = len(reserved) - len(busy)
        for uuid in [u for u in reserved if u not in busy][:max(missing, 0)]:
            runs = gaps[uuid]
            if runs and runs[-1][1] == left:
                runs[-1][1] = right
            else:
                runs.append([left, right])
    return [(uuid, start, end) for uuid in reserved for start, end in gaps.get(uuid, [])]


def _trim_past_end(ends: dict[int, datetime], accruals: dict[int, Accrual], prices: dict, *, accounts: dict) -> set[int]:
    """Cut the stored samples of these sessions that run past their end (``ends``: session pk -> ``held_until``) to it.

    Ingestion cuts the windows of an ended session to its end; a window stored while the session still ran can reach
    past the end it got later only by the clock skew between the node and the control plane. Such a sample still in
    its session's open period is cut to the end (priced again, ``billing.pricing``) or, when it began at or after the
    end, deleted (the session's later samples are not stored, so its id does not come back); the accrual and the
    account's ``accrued`` lose the difference. One already charged stays as it is (a charge never changes).

    Returns:
        The pks of the sessions whose accrual changed (the caller saves them).
    """
    past = Q()
    for session_id, until in ends.items():
        past |= Q(session_id=session_id, end__gt=until)
    changed: set[int] = set()
    for row in UsageSample.objects.filter(past, gap=False).order_by("pk"):
        accrual = accruals.get(row.session_id)
        if accrual is None or accrual.samples == 0 or row.billing_period != accrual.period_start:
            continue
        until = ends[row.session_id]
        if row.start >= until:
            cost, seconds = Decimal(0), Decimal(0)
        else:
            seconds = Decimal((until - row.start) // timedelta(microseconds=1)) / Decimal(1_000_000)
            cost = pricing.window_cost(price=pricing.price_for_model(row.gpu_model, prices), share=row.share, seconds=seconds)
        old_seconds = Decimal((row.end - row.start) // timedelta(microseconds=1)) / Decimal(1_000_000)
        accrual.amount -= row.cost - cost
        accrual.gpu_seconds = max(Decimal(0), (accrual.gpu_seconds - row.share * (old_seconds - seconds)).quantize(CREDITS))
        accounts[row.session_id].accrued -= row.cost - cost
        if row.start >= until:
            accrual.samples -= 1
            row.delete()
        else:
            UsageSample.objects.filter(pk=row.pk).update(end=until, cost=cost)
        accrual.last_end = min(accrual.last_end, until) if accrual.last_end else None
        if accrual.samples == 0:
            accrual.amount, accrual.gpu_seconds, accrual.first_start, accrual.last_end = Decimal(0), Decimal(0), None, None
        changed.add(row.session_id)
    return changed


def _bill_owners(owners: list[int], *, now: datetime) -> int:
    """Bill the due held time of ``owners``' sessions, in the caller's transaction (see ``held_gaps_bill``)."""
    settle = timedelta(seconds=settings.GSHARE_BILLING_SETTLE_SECONDS)
    missing = set(owners) - set(CreditAccount.objects.filter(user_id__in=owners).values_list("user_id", flat=True))
    if missing:
        CreditAccount.objects.bulk_create([CreditAccount(user_id=u) for u in sorted(missing)], ignore_conflicts=True)
    accounts = {a.user_id: a for a in CreditAccount.objects.select_for_update().filter(user_id__in=owners).order_by("pk")}
    held = list(HeldGpu.objects.select_for_update(of=("self",)).filter(billed_at__isnull=True, held_until__lte=now - settle,
                                                           session__owner_id__in=owners)
                .select_related("session", "session__cluster").order_by("session_id", "device_uuid"))
    if not held:
        return 0
    by_session: dict[int, list[HeldGpu]] = defaultdict(list)
    for row in held:
        by_session[row.session_id].append(row)
    with connection.cursor() as cursor:
        cursor.execute(_COVERAGE, [sorted(by_session)])
        coverage: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for session_id, uuid, start, end in cursor.fetchall():
            coverage[session_id][uuid].append((start, end))
    accruals = {a.session_id: a for a in Accrual.objects.filter(session_id__in=list(by_session))}
    prices = pricing.prices_by_model()
    length = periods.period_length()
    rows: list[UsageSample] = []
    new_accruals: list[Accrual] = []
    changed_accruals: list[Accrual] = []
    ends = {session_id: max(g.held_until for g in gpus) for session_id, gpus in by_session.items()}
    trimmed = _trim_past_end(ends, accruals, prices, accounts={g.session_id: accounts[g.session.owner_id] for g in held})
    changed_accruals.extend(accruals[pk] for pk in sorted(trimmed))
    for session_id, gpus in by_session.items():
        session = gpus[0].session
        reserved = {g.device_uuid: g for g in gpus}
        gaps = held_gaps(held_from=min(g.held_from for g in gpus), held_until=max(g.held_until for g in gpus),
                         reserved=list(reserved), covered=coverage.get(session_id, {}))
        if not gaps:
            continue
        accrual = accruals.get(session_id)
        last_start = max(start for _, start, _ in gaps)
        period = periods.EPOCH + (last_start - periods.EPOCH) // length * length
        if accrual is None:
            accrual = Accrual(session_id=session_id, account=accounts[session.owner_id], period_start=period, updated_at=now)
            new_accruals.append(accrual)
        else:
            if session_id not in trimmed:
                changed_accruals.append(accrual)
            if accrual.samples == 0:
                accrual.period_start = max(accrual.period_start, period)
        state = periods.Open(accrual.period_start, accrual.amount, accrual.gpu_seconds, accrual.samples, accrual.first_start,
                             accrual.last_end)
        for uuid, start, end in gaps:
            gpu = reserved[uuid]
            share = pricing.gpu_share(device_memory_mib=gpu.memory_mib, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
            seconds = Decimal((end - start) // timedelta(microseconds=1)) / Decimal(1_000_000)
            cost = pricing.window_cost(price=pricing.price_for_model(gpu.gpu_model, prices), share=share, seconds=seconds)
            rows.append(UsageSample(
                cluster_id=session.cluster_id, sample_id=f"{GAP_PREFIX}{session.public_id}:{uuid}:{(start - periods.EPOCH) // timedelta(microseconds=1)}",
                session_id=session_id, device_uuid=uuid, start=start, end=end, gpu_model=gpu.gpu_model, share=share, cost=cost,
                billing_period=accrual.period_start, gap=True,
            ))
            state.add(amount=cost, gpu_seconds=share * seconds, samples=1, first_start=start, last_end=end)
            account = accounts[session.owner_id]
            account.accrued += cost
        accrual.amount, accrual.samples, accrual.first_start, accrual.last_end = state.amount, state.samples, state.first_start, state.last_end
        accrual.gpu_seconds = state.gpu_seconds.quantize(CREDITS)
        accrual.updated_at = now
    UsageSample.objects.bulk_create(rows)
    Accrual.objects.bulk_create(new_accruals)
    Accrual.objects.bulk_update(changed_accruals, ["period_start", "amount", "gpu_seconds", "samples", "first_start", "last_end", "updated_at"])
    for account in accounts.values():
        below = account.balance - account.accrued < 0
        account.below_zero_since = (account.below_zero_since or now) if below else None
    CreditAccount.objects.bulk_update(list(accounts.values()), ["accrued", "below_zero_since"])
    HeldGpu.objects.filter(pk__in=[row.pk for row in held]).update(billed_at=now)
    return len(by_session)
