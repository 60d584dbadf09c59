"""Credits: accounts, the append-only ledger, prices per GPU model, usage samples and policies.

Money is ``Decimal`` with 6 decimal places (``CREDITS``), never float. The balance of an account always equals
the sum of its ledger entries' amounts; ``LedgerEntry.balance_after`` records it after each entry (entries of
one account are written under the account's row lock, so the running balance is exact). Usage is charged once per
session and billing period (``billing.periods``); what its samples cost since the last charge is accrued
(``Accrual``, ``CreditAccount.accrued``) and held against the balance until then.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeBoundary, RangeOperators
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

#: Credits are stored with this many decimal places (and 18 digits in all).
CREDIT_PLACES = 6
CREDITS = Decimal(1).scaleb(-CREDIT_PLACES)  # quantum: Decimal("0.000001")


def credit_field(**kwargs) -> models.DecimalField:
    """A credits column: ``numeric(18, 6)``."""
    return models.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES, **kwargs)


#: The largest volume quota, pool capacity or ``Policy.max_volume_gb``, GiB, whose size in bytes (1 GiB = 1024**3 bytes)
#: still fits a bigint column.
MAX_CAPACITY_GB = (2**63 - 1) // 1024**3

#: The default of ``Policy.max_volume_gb`` (and of ``GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB`` without a policy row), GiB.
DEFAULT_MAX_VOLUME_GB = 500


#: The default of ``Policy.max_runtime_hours`` (and of ``GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS`` without a policy row).
DEFAULT_MAX_RUNTIME_HOURS = Decimal(24)
#: The default of ``Policy.runtime_warning_minutes`` (and of ``GSHARE_BILLING_DEFAULT_RUNTIME_WARNING_MINUTES``).
DEFAULT_RUNTIME_WARNING_MINUTES = 15


#: Defaults of the policy's CPU and memory per GPU (``default_cpu_per_gpu`` cores, ``default_memory_gib_per_gpu`` GiB,
#: their maxima) and of its queue (``max_queued_sessions``, ``queue_timeout_hours``).
DEFAULT_CPU_PER_GPU = Decimal(4)
DEFAULT_MEMORY_GIB_PER_GPU = Decimal(16)
DEFAULT_MAX_CPU_PER_GPU = Decimal(16)
DEFAULT_MAX_MEMORY_GIB_PER_GPU = Decimal(128)
DEFAULT_MAX_QUEUED_SESSIONS = 3
DEFAULT_QUEUE_TIMEOUT_HOURS = Decimal(72)


class CreditAccount(models.Model):
    """A user's credits. ``balance`` (credits) = the sum of the account's ledger entries; ``accrued`` (credits, >= 0) =
    the sum of its sessions' ``Accrual.amount``: usage stored but not charged yet (its billing period is open).

    ``below_zero_since`` is when ``balance - accrued`` last went below zero (null while it is not): the grace of the
    user's policy counts from it before their sessions are stopped.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="credit_account")
    balance = credit_field(default=Decimal(0))
    accrued = credit_field(default=Decimal(0), db_default=Decimal(0), help_text="Usage of open billing periods, not charged yet (held against the balance)")
    below_zero_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(accrued__gte=0), name="account_accrued_not_negative")]

    @property
    def unbilled_balance(self) -> Decimal:
        """``balance - accrued``: what the account holds counting the usage not charged yet (credits)."""
        return self.balance - self.accrued

    def __str__(self) -> str:
        return f"{self.user} ({self.balance} credits)"


class LedgerEntry(models.Model):
    """One movement of credits; never updated or deleted.

    ``amount`` is signed (grants and refunds positive, charges negative). ``idempotency_key`` is unique: a
    retried grant or a replayed usage batch finds its entry instead of writing a second one. Charges name the
    ``session`` and the usage window (``window_start``..``window_end``, UTC: the first sample's start and the last one's
    end) they price. Charges written since billing periods (``billing.periods``) also name their period
    (``period_start``..``period_end``) and how many samples they cover (``sample_count``: the session's samples whose
    ``billing_period`` is ``period_start``); at most one per session and period (``ledger_one_charge_per_session_period``).
    Older charges priced one usage batch each (their samples point at them through ``UsageSample.entry``). An ``end`` entry (amount 0)
    closes a session the idle policy stopped: its window is the idle time and ``idle_credits`` what the session's
    usage samples in that window cost (already charged by its charges; the entry moves no credits). A ``storage`` entry
    (amount <= 0) charges one volume's quota held during one billing period (``billing.storage_charges``); at most one
    per volume and period (``ledger_one_storage_charge_per_volume_period``).
    """

    class Kind(models.TextChoices):
        GRANT = "grant", "Grant"
        CHARGE = "charge", "Charge"
        REFUND = "refund", "Refund"
        ADJUSTMENT = "adjustment", "Adjustment"
        END = "end", "Session end"
        STORAGE = "storage", "Storage charge"

    # No single-column indexes on these two: ``ledger_account_recent`` and ``ledger_session`` serve them (migration 0002).
    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="entries", db_index=False)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    amount = credit_field()
    balance_after = credit_field()
    idempotency_key = models.CharField(max_length=200, unique=True)
    # The volume's public id rather than a key: the ledger is never deleted, a deleted volume's row may be (pool_delete).
    volume = models.CharField(max_length=24, blank=True, default="", db_default="", help_text="Storage charges: the volume whose quota they price (vol_...)")
    session = models.ForeignKey("gpu_sessions.Session", on_delete=models.PROTECT, null=True, blank=True, related_name="ledger_entries",
                                db_index=False)
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    gpu_seconds = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True,
                                      help_text="Charges: GPU-seconds priced (share × seconds, summed over samples)")
    idle_credits = credit_field(null=True, blank=True, help_text="End entries: credits the session burned while idle (in its window)")
    period_start = models.DateTimeField(null=True, blank=True, help_text="Charges: the billing period they close (start, UTC)")
    period_end = models.DateTimeField(null=True, blank=True, help_text="Charges: the billing period they close (end, UTC)")
    sample_count = models.PositiveIntegerField(null=True, blank=True, help_text="Charges of a period: the usage samples they cover")
    reason = models.CharField(max_length=500, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="", help_text="Who wrote it: api:<user>, console:<user>, usage")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "ledger entry"
        verbose_name_plural = "ledger entries"
        ordering = ["-id"]
        indexes = [models.Index(fields=["account", "-id"], name="ledger_account_recent"),
                   models.Index(fields=["session"], name="ledger_session")]
        constraints = [
            models.CheckConstraint(condition=~Q(kind="charge") | Q(amount__lte=0), name="ledger_charge_not_positive"),
            models.CheckConstraint(condition=~Q(kind__in=["grant", "refund"]) | Q(amount__gte=0), name="ledger_grant_refund_not_negative"),
            models.CheckConstraint(condition=~Q(kind="end") | Q(amount=0), name="ledger_end_moves_nothing"),
            models.CheckConstraint(condition=Q(period_start__isnull=True) | Q(period_end__gt=models.F("period_start")),
                                   name="ledger_period_end_after_start"),
            models.UniqueConstraint(fields=["session", "period_start"], condition=Q(kind="charge", period_start__isnull=False),
                                    name="ledger_one_charge_per_session_period"),
            models.CheckConstraint(condition=~Q(kind="storage") | (Q(amount__lte=0) & ~Q(volume="") & Q(period_start__isnull=False)),
                                   name="ledger_storage_charge_shape"),
            models.UniqueConstraint(fields=["volume", "period_start"], condition=Q(kind="storage"),
                                    name="ledger_one_storage_charge_per_volume_period"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} ({self.idempotency_key})"


class Price(models.Model):
    """Credits per GPU-hour for a GPU model (the device ``model`` from inventory, e.g. ``NVIDIA H100 80GB HBM3``).

    The row with an empty ``gpu_model`` is the default for models without their own price.
    """

    gpu_model = models.CharField(max_length=200, unique=True, blank=True, default="",
                                 help_text="Device model as inventory reports it; empty = the default price")
    credits_per_gpu_hour = credit_field(validators=[MinValueValidator(Decimal(0))])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "GPU price"
        verbose_name_plural = "GPU prices"
        ordering = ["gpu_model"]

    def __str__(self) -> str:
        return f"{self.gpu_model or '(default)'}: {self.credits_per_gpu_hour}/GPU-hour"


class Policy(models.Model):
    """Limits for one user, or (``user`` null) the default for users without their own.

    Attributes:
        max_sessions: concurrent live sessions (null: unlimited).
        max_gpus: GPUs across live sessions (null: unlimited).
        max_volume_gb: GiB the user's volumes (not deleted) may hold in all, the sum of their quotas (null: unlimited;
            default ``DEFAULT_MAX_VOLUME_GB``).
        allowed_clusters: clusters sessions may run on (empty: all).
        min_balance_hours: a session may start only if the available balance covers this many hours of the
            requested resources at their price (0: any non-negative balance).
        grace_seconds: how long an account may stay below zero before its sessions are stopped.
        idle_timeout_minutes: a Running session none of whose GPUs ran a kernel, and that nobody connected to, for this
            long is stopped (0: never; ``sessions.idle``). A minute lasts ``GSHARE_IDLE_POLICY_MINUTE_SECONDS``.
        idle_warning_minutes: how long before that stop the session shows ``idle_since`` and ``stops_at``.
        max_runtime_hours: the longest a session may hold its GPUs, hours from its reservation (``runtime_hours`` of a
            request, and its extensions by the owner, stay within it; 0: unlimited; ``sessions.runtime``).
        runtime_warning_minutes: how long before its time limit a session shows the coming stop.
        default_cpu_per_gpu, default_memory_gib_per_gpu: CPU cores and GiB of memory per GPU a request gets when it
            asks for none; max_cpu_per_gpu, max_memory_gib_per_gpu: the most it may ask per GPU.
        priority: the queue order of the user's sessions (higher first; ``sessions.queue``).
        max_queued_sessions: sessions the user may have waiting in the queue at once.
        queue_timeout_hours: how long a session may wait in the queue before it is dropped.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="policy")
    max_sessions = models.PositiveIntegerField(null=True, blank=True)
    max_gpus = models.PositiveIntegerField(null=True, blank=True)
    max_volume_gb = models.PositiveBigIntegerField(
        null=True, blank=True, default=DEFAULT_MAX_VOLUME_GB,
        help_text="GiB the user's volumes may hold in all (the sum of their quotas; empty: no limit)")
    allowed_clusters = models.ManyToManyField("clusters.Cluster", blank=True, related_name="+")
    min_balance_hours = models.DecimalField(max_digits=8, decimal_places=3, default=Decimal(1), validators=[MinValueValidator(Decimal(0))])
    grace_seconds = models.PositiveIntegerField(default=900)
    idle_timeout_minutes = models.PositiveIntegerField(
        default=60,
        help_text="Stop a session after this many minutes without a GPU kernel (browser connections count only while its GPU activity is "
                  "unknown; 0: never)")
    idle_warning_minutes = models.PositiveIntegerField(
        default=15, help_text="Show the coming idle stop this many minutes before it (at most the timeout)")
    max_runtime_hours = models.DecimalField(
        max_digits=7, decimal_places=2, default=DEFAULT_MAX_RUNTIME_HOURS, validators=[MinValueValidator(Decimal(0))],
        help_text="The longest a session may run, in hours from its reservation (its time limit; 0: unlimited)")
    runtime_warning_minutes = models.PositiveIntegerField(
        default=DEFAULT_RUNTIME_WARNING_MINUTES, help_text="Show the coming stop at a session's time limit this many minutes before it")
    default_cpu_per_gpu = models.DecimalField(
        max_digits=6, decimal_places=2, default=DEFAULT_CPU_PER_GPU, validators=[MinValueValidator(Decimal(0))],
        help_text="CPU cores per GPU a session gets when its request asks for none")
    default_memory_gib_per_gpu = models.DecimalField(
        max_digits=8, decimal_places=2, default=DEFAULT_MEMORY_GIB_PER_GPU, validators=[MinValueValidator(Decimal(0))],
        help_text="Memory (GiB) per GPU a session gets when its request asks for none")
    max_cpu_per_gpu = models.DecimalField(
        max_digits=6, decimal_places=2, default=DEFAULT_MAX_CPU_PER_GPU, validators=[MinValueValidator(Decimal(0))],
        help_text="The most CPU cores per GPU a session may ask for")
    max_memory_gib_per_gpu = models.DecimalField(
        max_digits=8, decimal_places=2, default=DEFAULT_MAX_MEMORY_GIB_PER_GPU, validators=[MinValueValidator(Decimal(0))],
        help_text="The most memory (GiB) per GPU a session may ask for")
    priority = models.IntegerField(default=0, help_text="Queue order of the user's sessions: higher first, then arrival")
    max_queued_sessions = models.PositiveIntegerField(
        default=DEFAULT_MAX_QUEUED_SESSIONS, help_text="Sessions the user may have waiting in the queue at once (0: none may queue)")
    queue_timeout_hours = models.DecimalField(
        max_digits=7, decimal_places=2, default=DEFAULT_QUEUE_TIMEOUT_HOURS, validators=[MinValueValidator(Decimal(0))],
        help_text="Hours a session may wait in the queue before it is dropped")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "policies"
        constraints = [models.UniqueConstraint(fields=["user"], condition=Q(user__isnull=True), name="policy_one_default",
                                               nulls_distinct=False)]

    def __str__(self) -> str:
        return f"policy of {self.user}" if self.user_id else "default policy"


#: The exclusion constraint that keeps two samples of one session and GPU from covering the same instant.
USAGE_OVERLAP_CONSTRAINT = "usage_sample_no_overlap"


class TsTzRange(models.Func):
    """``tstzrange(lower, upper, bounds)``: the usage window as a range, for the exclusion constraint."""

    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


class UsageSample(models.Model):
    """One usage sample an operator reported (``POST /internal/v1/usage``); unique per ``(cluster, sample_id)``.

    ``start``/``end`` (UTC) bound the window; ``share`` is the fraction of the GPU the session holds
    (``max(gpu_memory_mib / device memory, gpu_cores / 100)``, 1 for a whole GPU) and ``cost`` (credits) what the
    window costs. ``billing_period`` is the start of the billing period whose charge covers it (the period of its
    start, or the session's open period when that one has been charged already: ``billing.periods``); samples stored
    before periods existed have none and point at their per-batch charge, ``entry``, instead.

    ``gap`` rows are not the operator's: ``billing.held`` writes them at the session's end for the time it held a GPU
    that no sample covered (``sample_id`` ``gap:<session id>:<device uuid>:<start, epoch µs>``; operators may not use
    the ``gap:`` prefix).

    No two samples of one session and GPU cover the same instant (``usage_sample_no_overlap``: an exclusion
    constraint on ``(session, device_uuid, tstzrange(start, end, '[)'))``, GiST with ``btree_gist``), so a GPU-second
    is stored, and charged, once whatever writes the rows and however they race; windows that touch do not overlap.
    """

    # Every index costs each of the many inserts: ``cluster`` is served by the unique (cluster, sample_id) index and
    # ``session`` by ``usage_session_start``, so neither has its own (migration 0002).
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="usage_samples", db_index=False)
    sample_id = models.CharField(max_length=128)
    session = models.ForeignKey("gpu_sessions.Session", on_delete=models.PROTECT, related_name="usage_samples", db_index=False)
    device_uuid = models.CharField(max_length=128)
    start = models.DateTimeField()
    end = models.DateTimeField()
    gpu_util_percent = models.DecimalField(max_digits=6, decimal_places=2, null=True, blank=True)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    gpu_model = models.CharField(max_length=200, blank=True, default="")
    share = models.DecimalField(max_digits=9, decimal_places=6)
    cost = credit_field()
    entry = models.ForeignKey(LedgerEntry, on_delete=models.PROTECT, null=True, blank=True, related_name="samples")
    billing_period = models.DateTimeField(null=True, blank=True, help_text="Start of the billing period whose charge covers it")
    gap = models.BooleanField(default=False, db_default=False,
                              help_text="Held time no operator sample covered, billed at the session's end (billing.held)")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "sample_id"], name="usage_sample_unique_per_cluster"),
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="usage_sample_end_after_start"),
            ExclusionConstraint(
                name=USAGE_OVERLAP_CONSTRAINT,
                expressions=[("session", RangeOperators.EQUAL), ("device_uuid", RangeOperators.EQUAL),
                             (TsTzRange("start", "end", RangeBoundary()), RangeOperators.OVERLAPS)],
                violation_error_message="Another usage sample of this session and GPU covers part of this window.",
            ),
        ]
        indexes = [models.Index(fields=["session", "start"], name="usage_session_start")]


class Accrual(models.Model):
    """What one session's usage samples cost since its last charge: its open billing period (``billing.periods``).

    One row per session that ever reported usage or had held GPU time billed (``billing.held``), written only under its
    owner's account lock (usage ingestion, the held time's billing and the period close). ``period_start`` is the open
    period: a new sample accrues into ``max(the period of its start, period_start)``; a sample of a later period first
    closes this one. ``amount`` (credits), ``gpu_seconds``,
    ``samples`` and the first start / last end of their windows are what the period's charge will say; all zero
    (and the windows null) when nothing is open. The account's ``accrued`` is the sum of its rows' ``amount``.
    """

    session = models.OneToOneField("gpu_sessions.Session", on_delete=models.PROTECT, primary_key=True, related_name="accrual")
    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="accruals", db_index=False)
    period_start = models.DateTimeField()
    amount = credit_field(default=Decimal(0))
    gpu_seconds = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    samples = models.PositiveIntegerField(default=0)
    first_start = models.DateTimeField(null=True, blank=True)
    last_end = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "accrued usage"
        verbose_name_plural = "accrued usage"
        ordering = ["session_id"]
        # One index besides the key, on a column an accrual never changes: ingestion's upsert then updates rows in place
        # (PostgreSQL's HOT updates, helped by the table's fillfactor, migration 0007) without touching any index. The
        # periodic close reads the open rows without one (one row per live session, once a minute).
        indexes = [models.Index(fields=["account"], name="accrual_account")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0) & Q(gpu_seconds__gte=0), name="accrual_not_negative"),
            models.CheckConstraint(condition=Q(samples__gt=0) | (Q(amount=0) & Q(first_start__isnull=True)), name="accrual_empty_when_closed"),
        ]

    def __str__(self) -> str:
        return f"{self.amount} credits accrued by session {self.session_id} since {self.period_start}"


class StorageHolding(models.Model):
    """A stretch of time during which one volume held one quota: ``quota_gb`` GiB from ``start`` until ``end`` (UTC; null:
    still held). Written by ``billing.storage_charges`` when a volume is created, its quota raised, or it is deleted;
    priced per billing period by the same module.

    ``charged_until`` is how far its time has been charged: a billing period boundary once a period it overlaps was
    charged (``start`` before). No two holdings of a volume overlap (``storage_holding_no_overlap``), and a volume has at
    most one open holding (``storage_holding_one_open``).
    """

    volume = models.ForeignKey("storage.Volume", on_delete=models.CASCADE, related_name="holdings")
    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="storage_holdings")
    quota_gb = models.PositiveBigIntegerField()
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)
    charged_until = models.DateTimeField()

    class Meta:
        ordering = ["volume_id", "start"]
        indexes = [models.Index(fields=["charged_until"], name="storage_holding_charged")]
        constraints = [
            models.CheckConstraint(condition=Q(quota_gb__gte=1), name="storage_holding_quota_positive"),
            models.CheckConstraint(condition=Q(end__isnull=True) | Q(end__gt=models.F("start")), name="storage_holding_end_after_start"),
            models.UniqueConstraint(fields=["volume"], condition=Q(end__isnull=True), name="storage_holding_one_open"),
            ExclusionConstraint(
                name="storage_holding_no_overlap",
                expressions=[("volume", RangeOperators.EQUAL), (TsTzRange("start", "end", RangeBoundary()), RangeOperators.OVERLAPS)],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.quota_gb} GiB of volume {self.volume_id} from {self.start} until {self.end or 'now'}"


class HeldGpu(models.Model):
    """A GPU placement reserved for a session, and for how long: written when the reservation is released at the
    session's end (``sessions.lifecycle.end``), read by ``billing.held`` to bill every second of it.

    ``held_from`` is when the session was created (``sessions.create`` creates it and reserves its GPUs in one
    transaction), ``held_until`` when it ended (``Session.ended_at``: the reservation is released in that
    transaction). ``gpu_model`` and ``memory_mib`` are the device's at the release, so the held time is priced as the
    samples are even after inventory removed the GPU. ``billed_at`` is set, under the owner's account lock, once every
    second of ``[held_from, held_until)`` not covered by a usage sample was billed (``UsageSample.gap`` rows): usage
    samples of the session that arrive later are not stored (each of its held seconds is billed already).
    """

    session = models.ForeignKey("gpu_sessions.Session", on_delete=models.PROTECT, related_name="held_gpus", db_index=False)
    device_uuid = models.CharField(max_length=128)
    gpu_model = models.CharField(max_length=200, blank=True, default="")
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    held_from = models.DateTimeField()
    held_until = models.DateTimeField()
    billed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "held GPU"
        verbose_name_plural = "held GPUs"
        constraints = [
            models.UniqueConstraint(fields=["session", "device_uuid"], name="held_gpu_once_per_session"),
            models.CheckConstraint(condition=Q(held_until__gte=models.F("held_from")), name="held_gpu_until_after_from"),
        ]
        # The periodic close looks for the holds not billed yet (a handful among every session's).
        indexes = [models.Index(fields=["held_until"], name="held_gpu_unbilled", condition=Q(billed_at__isnull=True))]

    def __str__(self) -> str:
        return f"{self.device_uuid} held by session {self.session_id} {self.held_from:%Y-%m-%d %H:%M:%S}–{self.held_until:%H:%M:%S}"
