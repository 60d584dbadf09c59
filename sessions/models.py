"""GPU sessions and the GPU shares the control plane reserved for them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.ids import new_session_id


class SessionQuerySet(models.QuerySet):
    """Sessions by where they stand. Billing and storage sit below sessions and reach these through their relations
    (``user.gpu_sessions.live()``, ``volume.sessions.live()``): a related manager has the default manager's methods."""

    def live(self) -> SessionQuerySet:
        """The sessions that have not ended (neither Terminated nor Failed): they hold their GPUs, volumes and credits."""
        return self.exclude(phase__in=Session.TERMINAL_PHASES)

    def admitted(self) -> SessionQuerySet:
        """The live sessions that left the queue: they hold GPUs, credits and quota (``live`` without ``Queued``)."""
        return self.exclude(phase__in=Session.HOLDING_EXCLUDED_PHASES)

    def queued(self) -> SessionQuerySet:
        """The sessions waiting in the fleet-wide queue (``sessions.queue``)."""
        return self.filter(phase=Session.Phase.QUEUED)

    def running(self) -> SessionQuerySet:
        """The Running sessions (what their usage costs now: ``billing.selectors.burn_rate``)."""
        return self.filter(phase=Session.Phase.RUNNING)

    def with_devices(self) -> SessionQuerySet:
        """With each session's GPU reservations (``allocations``, primary-key order) and their devices prefetched:
        two queries in all, however many sessions."""
        return self.prefetch_related(models.Prefetch("allocations", queryset=Allocation.objects.select_related("device").order_by("pk")))


class Session(models.Model):
    """An interactive GPU session: a pod on one cluster, reached at that cluster's ``session_domain``.

    ``gpu_memory_mib`` (MiB per GPU, HAMi ``nvidia.com/gpumem``) and ``gpu_cores`` (percent of one
    GPU, HAMi ``nvidia.com/gpucores``) are both null for whole-GPU sessions. ``gpu_models`` lists the GPU models
    it may be placed on, resolved from the request's names (``sessions.gpu_models``); empty means any model.
    Rows are kept after the session ends (and after its cluster is deregistered) so history stays readable.

    The phase is also the outbox of the background work: ``Scheduled`` means "apply to the cluster is due",
    ``Stopping`` "delete from the cluster is due", and ``reapply_due_at`` set "apply again, the cluster's routing
    changed" (``sessions.reapply``); ``sessions.reconcile`` publishes those tasks again when their first publish was
    lost (docs/sessions.md).

    ``ends_at`` is the session's time limit (null: none): set at its reservation, ``created_at`` + its runtime hours,
    moved by extensions, and enforced by ``sessions.runtime``.
    """

    class Phase(models.TextChoices):
        QUEUED = "Queued"
        PENDING = "Pending"
        SCHEDULED = "Scheduled"
        STARTING = "Starting"
        RUNNING = "Running"
        STOPPING = "Stopping"
        TERMINATED = "Terminated"
        FAILED = "Failed"

    TERMINAL_PHASES = (Phase.TERMINATED, Phase.FAILED)
    #: Phases that hold GPUs, credits and quota: live and admitted (a queued session holds none of them).
    HOLDING_EXCLUDED_PHASES = (Phase.QUEUED, Phase.TERMINATED, Phase.FAILED)

    objects = SessionQuerySet.as_manager()

    class StopReason(models.TextChoices):
        REQUESTED = "requested", "on request"
        CREDITS = "credits", "credits ran out"
        IDLE = "idle", "idle policy"
        TIME_LIMIT = "time_limit", "time limit reached"
        QUEUE_TIMEOUT = "queue_timeout", "waited in the queue too long"

    public_id = models.CharField(max_length=24, unique=True, default=new_session_id, editable=False)
    name = models.CharField(max_length=63, blank=True, default="")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="gpu_sessions")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="sessions", null=True, blank=True)
    requested_cluster = models.ForeignKey(
        "clusters.Cluster", on_delete=models.PROTECT, related_name="pinned_sessions", null=True, blank=True
    )
    image = models.CharField(max_length=512)
    gpus = models.PositiveSmallIntegerField()
    gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    gpu_cores = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu_models = models.JSONField(
        default=list, blank=True,
        help_text="The GPU models the session accepts, as the fleet names them (sessions.gpu_models); empty: any model",
    )
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PENDING)
    node = models.CharField(max_length=253, blank=True, default="")
    devices = models.JSONField(default=list, blank=True, help_text="GPU UUIDs allocated by HAMi, as reported by the operator")
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    last_status_at = models.DateTimeField(null=True, blank=True, help_text="observed_at of the last status report applied")
    stop_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was asked to stop (a session Stopping for long is published again by sessions.reconcile)"
    )
    stop_reason = models.CharField(max_length=16, choices=StopReason.choices, blank=True, default="",
                                   help_text="Why it was asked to stop (empty while it was not)")
    volumes = models.ManyToManyField("storage.Volume", blank=True, related_name="sessions",
                                     help_text="Volumes mounted at /data/<volume name>")
    idempotency_key = models.CharField(max_length=150, blank=True, default="",
                                       help_text="The Idempotency-Key it was created with (unique per owner), or empty")
    request_fingerprint = models.CharField(max_length=64, blank=True, default="",
                                           help_text="SHA-256 of the create request of idempotency_key: a retry must match it")
    reapply_due_at = models.DateTimeField(
        null=True, blank=True,
        help_text="Since when its GShareSession must be applied again because its cluster's routing changed (cleared once "
                  "applied; sessions.reconcile publishes it again when it stays set)",
    )

    ends_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When its time limit stops it (its reservation + its runtime hours, plus extensions; empty: no limit)")
    runtime_hours = models.DecimalField(
        max_digits=7, decimal_places=2, null=True, blank=True,
        help_text="The runtime hours asked (empty: the policy's maximum); a queued session's ends_at counts them from its admission")
    cpu = models.DecimalField(max_digits=7, decimal_places=3, null=True, blank=True,
                              help_text="CPU cores the pod requests and is limited to (empty: none asked, sessions before CPU requests)")
    memory_gib = models.DecimalField(max_digits=9, decimal_places=3, null=True, blank=True,
                                     help_text="Memory (GiB) the pod requests and is limited to; /dev/shm is half of it")
    priority = models.IntegerField(default=0, help_text="Queue order: higher first, then arrival (the owner's policy; staff may change it)")
    queued_at = models.DateTimeField(null=True, blank=True, help_text="When it joined the queue (empty: never queued)")
    queue_expires_at = models.DateTimeField(null=True, blank=True,
                                            help_text="When it leaves the queue unstarted (queued_at + the policy's queue_timeout_hours)")
    admitted_at = models.DateTimeField(null=True, blank=True, help_text="When the queue admitted it (its GPUs were reserved)")
    queue_position = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="1-based place among the queued sessions that could use the same GPUs")
    estimated_start = models.DateTimeField(null=True, blank=True, help_text="When the queue expects to start it (empty: unknown)")
    first_estimated_start = models.DateTimeField(null=True, blank=True,
                                                 help_text="The estimate made when it was queued (the estimate's accuracy is measured against it)")
    waiting_for = models.TextField(blank=True, default="", help_text="Why it waits, in words")
    alternatives = models.JSONField(default=list, blank=True, help_text="Requests that would start sooner (sessions.queue)")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "phase"]),
            models.Index(fields=["owner", "phase"]),
            # The console's sessions tile and 24-hour chart read live and recently ended sessions
            # (``ended_at IS NULL OR ended_at > ...``): a B-tree keeps NULLs, so one index serves both arms.
            models.Index(fields=["ended_at"], name="session_ended_at_idx"),
            # sessions.reconcile looks for the re-applies still due; almost every row has none.
            models.Index(fields=["reapply_due_at"], name="session_reapply_due_idx", condition=Q(reapply_due_at__isnull=False)),
            # Admission counts a user's live sessions on every session_create: only those, not the user's history.
            models.Index(fields=["owner"], name="session_live_owner_idx", condition=~Q(phase__in=["Terminated", "Failed"])),
            # The queue's admission and estimate passes read the queued sessions in order: only those.
            models.Index(fields=["-priority", "queued_at", "id"], name="session_queue_order_idx", condition=Q(phase="Queued")),
            # sessions.enforce_runtime looks for the live sessions past their time limit: only those that have one.
            models.Index(fields=["ends_at"], name="session_live_ends_at_idx",
                         condition=Q(ends_at__isnull=False) & ~Q(phase__in=["Terminated", "Failed"])),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="session_gpus_positive"),
            models.CheckConstraint(
                condition=Q(gpu_cores__isnull=True) | (Q(gpu_cores__gte=1) & Q(gpu_cores__lte=100)),
                name="session_gpu_cores_percent",
            ),
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"], condition=~Q(idempotency_key=""), name="session_idempotency_key_once_per_owner"
            ),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_live(self) -> bool:
        """True until the session is Terminated or Failed."""
        return self.phase not in self.TERMINAL_PHASES

    @property
    def offers_open(self) -> bool:
        """Whether the session can be opened now: it runs and has a cluster (so a URL). Who may: ``sessions.permissions``."""
        return self.phase == self.Phase.RUNNING and self.cluster_id is not None

    @property
    def offers_stop(self) -> bool:
        """Whether the session can be stopped now: it is live and not already stopping."""
        return self.is_live and self.phase != self.Phase.STOPPING

    @property
    def whole_gpus(self) -> bool:
        """True when neither memory nor cores were asked: each GPU is the session's alone."""
        return self.gpu_memory_mib is None and self.gpu_cores is None

    @classmethod
    def live_on_cluster(cls, cluster) -> int:
        """How many live sessions are on ``cluster`` (what the sessions app answers ``clusters.signals.cluster_deregistering``)."""
        return cls.objects.filter(cluster=cluster).exclude(phase__in=cls.TERMINAL_PHASES).count()


class Allocation(models.Model):
    """A share of one GPU reserved for a live session by placement (released when the session ends).

    ``memory_mib`` (MiB) and ``cores`` (percent of one GPU) are what is subtracted from the device's
    HAMi capacity; ``exclusive`` marks a whole-GPU reservation (nothing else may share the device).
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="allocations")
    device = models.ForeignKey("clusters.GpuDevice", on_delete=models.CASCADE, related_name="allocations")
    memory_mib = models.PositiveIntegerField()
    cores = models.PositiveIntegerField()
    exclusive = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "device"], name="allocation_once_per_device")]
        indexes = [models.Index(fields=["device"])]

    def __str__(self) -> str:
        return f"{self.session_id} on {self.device_id}"


class SessionActivity(models.Model):
    """What the session's GPUs and its users did last, and where the idle policy stands (``sessions.activity``,
    ``sessions.idle``). One row per session, made by the first activity report or connection.

    ``state``/``reason``/``sampled_at``/``gpus`` are the operator's last reading of HAMi's vGPU monitor
    (``contract.ACTIVITY_PATH``; ``gpus`` as reported, per GPU: ``device_uuid``,
    ``last_kernel_seconds``, ``utilization_percent``, ``memory_used_bytes``, ``memory_limit_bytes``, ``sampled_at``).
    ``last_kernel_at`` is the newest instant any of its GPUs ran a kernel over every reading (never moves back);
    ``last_connected_at`` the newest connect verify that let someone in (written at most once a minute, from Redis).
    ``idle_since``/``stops_at`` are set while the idle policy's warning runs (null otherwise); ``exempt_until``,
    with its reason and who set it, suspends the policy for this session.
    """

    class State(models.TextChoices):
        OK = "ok"
        UNKNOWN = "unknown"

    session = models.OneToOneField(Session, on_delete=models.CASCADE, primary_key=True, related_name="activity")
    state = models.CharField(max_length=16, choices=State.choices, blank=True, default="",
                             help_text="ok: the GPU monitor was read; unknown: it could not be (reason); empty: no report yet")
    reason = models.CharField(max_length=1000, blank=True, default="")
    sampled_at = models.DateTimeField(null=True, blank=True)
    gpus = models.JSONField(default=list, blank=True)
    last_kernel_at = models.DateTimeField(null=True, blank=True)
    last_connected_at = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)
    stops_at = models.DateTimeField(null=True, blank=True)
    exempt_until = models.DateTimeField(null=True, blank=True)
    exempt_reason = models.CharField(max_length=500, blank=True, default="")
    exempt_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        verbose_name = "session activity"
        verbose_name_plural = "session activity"
        # The dashboard and /metrics count the sessions in their idle warning.
        indexes = [models.Index(fields=["idle_since"], name="activity_idle_since", condition=Q(idle_since__isnull=False))]

    def __str__(self) -> str:
        return f"activity of {self.session_id}"


class SuggestedImage(models.Model):
    """A container image staff suggest on the console's Start session form (any other image may still be typed)."""

    image = models.CharField(max_length=512, unique=True, help_text="Image reference, e.g. quay.io/jupyter/pytorch-notebook:cuda12-latest")
    description = models.CharField(max_length=200, blank=True, default="", help_text="Shown next to the image in the suggestions")
    position = models.PositiveSmallIntegerField(default=0, help_text="Order in the suggestions (lowest first)")

    class Meta:
        ordering = ["position", "image"]

    def __str__(self) -> str:
        return self.image
