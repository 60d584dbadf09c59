"""Data-plane clusters, their GPU nodes and GPU devices (as reported by each cluster's operator)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from contract import (
    GATEWAY_NAME_DEFAULT,
    GATEWAY_NAMESPACE_DEFAULT,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
)
from core.crypto import EncryptedTextField
from core.ids import new_cluster_id
from core.names import cluster_name_validator, dns_name_validator


class ClusterQuerySet(models.QuerySet):
    """Cluster rows, with the selections every list makes."""

    def registered(self) -> ClusterQuerySet:
        """The clusters that are not deregistered, without their kubeconfig (each is decrypted when read; lists show none)."""
        return self.exclude(status=Cluster.Status.DEREGISTERED).defer("kubeconfig")


class Cluster(models.Model):
    """A registered data-plane Kubernetes cluster.

    ``kubeconfig`` is the credential the control plane uses to reach the cluster's apiserver; it is
    encrypted at rest (MultiFernet), never returned by the API and never shown in the console.
    A deregistered cluster keeps its row (status ``deregistered``) so history stays readable; its
    name, its ``session_domain`` and its identity (``kube_system_uid``) become free for a new
    registration. Among the other clusters each of the three is unique (partial unique indexes).
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending (registered, waiting for the operator's first report)"
        CONNECTED = "connected", "Connected"
        DEGRADED = "degraded", "Degraded"
        UNREACHABLE = "unreachable", "Unreachable"
        DEREGISTERED = "deregistered", "Deregistered"

    class Routing(models.TextChoices):
        """How session requests reach the cluster's pods (``spec.routing`` of its GShareSessions)."""

        GATEWAY_API = ROUTING_GATEWAY_API, "Gateway API (Envoy Gateway, HTTPRoute + SecurityPolicy extAuth)"
        INGRESS_NGINX = ROUTING_INGRESS_NGINX, "ingress-nginx (Ingress + auth-url; retired upstream 2026-03-24)"

    objects = ClusterQuerySet.as_manager()

    public_id = models.CharField(max_length=24, unique=True, default=new_cluster_id, editable=False)
    name = models.CharField(max_length=63, validators=[cluster_name_validator])
    apiserver_url = models.CharField(max_length=512)
    kubeconfig = EncryptedTextField()
    session_domain = models.CharField(max_length=253, blank=True, default="", validators=[dns_name_validator])
    ingress_node = models.CharField(max_length=253, blank=True, default="", validators=[dns_name_validator])
    routing = models.CharField(
        max_length=16, choices=Routing.choices, default=Routing.INGRESS_NGINX,
        help_text="How session requests reach pods: gateway-api (an HTTPRoute on the Gateway below, Envoy Gateway's extAuth) or ingress-nginx",
    )
    gateway_name = models.CharField(
        max_length=253, default=GATEWAY_NAME_DEFAULT, validators=[dns_name_validator],
        help_text="The Gateway session HTTPRoutes attach to (gateway-api routing)",
    )
    gateway_namespace = models.CharField(
        max_length=63, default=GATEWAY_NAMESPACE_DEFAULT, validators=[cluster_name_validator],
        help_text="Namespace of that Gateway",
    )
    volume_storage_class = models.CharField(max_length=253, blank=True, default="", validators=[dns_name_validator])
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    kubernetes_version = models.CharField(max_length=64, blank=True, default="")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_connection_test = models.JSONField(null=True, blank=True)
    last_connection_test_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    deregistered_at = models.DateTimeField(null=True, blank=True)
    kube_system_uid = models.CharField(
        max_length=64, blank=True, default="", editable=False,
        help_text="metadata.uid of the cluster's kube-system namespace, read at registration: a new kubeconfig must reach the same cluster",
    )
    credential_generation = models.PositiveIntegerField(
        default=1, editable=False,
        help_text="Carried by every operator token (claim gen); bumped by revocation and deregistration, which refuses every older token at once",
    )
    operator_token_expires_at = models.DateTimeField(null=True, blank=True, editable=False, help_text="Expiry of the newest operator token issued (UTC)")
    operator_token_rotated_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the last rotation wrote a token into the cluster's Secret"
    )
    operator_token_rotation_attempted_at = models.DateTimeField(null=True, blank=True, editable=False, help_text="When the last rotation was tried")
    operator_token_rotation_error = models.TextField(blank=True, default="", editable=False, help_text="Why the last rotation failed (empty when it succeeded)")
    operator_refused_since = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="Since when the operator's callbacks are refused (its validly signed token refused: expired, revoked...); cleared when one is accepted",
    )
    operator_refused_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Latest refused callback on record (recorded at most once a minute)"
    )
    operator_refused_reason = models.CharField(
        max_length=32, blank=True, default="", editable=False,
        help_text="Why the latest callback was refused: token_expired, token_revoked, cluster_deregistered, ... (a code, never the token)",
    )
    operator_checks = models.JSONField(
        default=dict, blank=True, editable=False,
        help_text="The session-path checks of the operator's latest inventory, as reported from inside the cluster: name -> "
                  "{ok, detail, checked_at} (session_domain_resolves, verify_reachable); empty when the operator sends none",
    )
    inventory_digest = models.CharField(
        max_length=80, blank=True, default="", editable=False,
        help_text="Digest of the operator's last applied inventory snapshot (contract.inventory_digest); a "
                  "digest-only report naming it needs no full snapshot. Empty: the next report must be a full snapshot",
    )
    clock_offset_seconds = models.FloatField(
        null=True, blank=True, editable=False,
        help_text="Seconds to add to the operator's clock to get the control plane's, as its latest inventory reported "
                  "them (from the server_time of its calls); null when it reports none (an operator that predates it)",
    )
    clock_offset_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the control plane received that offset",
    )

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=~Q(status="deregistered"), name="cluster_name_unique_while_registered"
            ),
            # One registration per physical cluster: two rows reaching one apiserver would share its operator
            # Secret (each rotation overwriting the other's token). Clusters registered before identities were
            # recorded have no uid yet, and a server without kube-system none at all: they are left out.
            models.UniqueConstraint(
                fields=["kube_system_uid"], condition=~Q(status="deregistered") & ~Q(kube_system_uid=""),
                name="cluster_kube_system_uid_unique_while_registered",
            ),
            # A session hostname routes to one cluster's ingress.
            models.UniqueConstraint(
                fields=["session_domain"], condition=~Q(status="deregistered") & ~Q(session_domain=""),
                name="cluster_session_domain_unique_while_registered",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class Node(models.Model):
    """A GPU node of a cluster (label ``gpu=on``), as in the operator's latest inventory snapshot.

    ``load``, ``free_devices``, ``open_devices``, ``max_free_memory_mib`` and ``max_free_cores``
    summarise the node's GPUs for placement (``sessions.placement``), so the fit query can walk the
    nodes in policy order through an index, pass over the nodes that cannot fit the request without
    reading their GPUs, and stop at the first that fits, instead of aggregating the fleet's
    reservations on every decision. The last four are bounds (the GPUs themselves are checked), so a
    node is never passed over wrongly. ``cluster_name`` is a copy of ``Cluster.name`` (which never
    changes once registered) for the same reason: the indexes order ties by cluster name, then node name.

    They are written only by ``clusters.services.inventory_apply`` (from the device counters) and
    by ``sessions.placement.usage_recompute`` (from ``sessions.Allocation``), always under the
    cluster's row lock. Rows written any other way (fixtures, a bulk load) must be followed by
    ``usage_recompute()``.

    ``cpu_allocatable_millicores`` and ``memory_allocatable_mib`` are the node's ``status.allocatable``, and
    ``cpu_requested_millicores``/``memory_requested_mib`` what its pods that are not sessions request, as the operator
    reports them; placement fits a session's CPU and memory in what is left after those and the live sessions on the
    node. A node without allocatable figures (an operator that predates them) has no CPU or memory limit.

    A node left out of a snapshot while a live session holds one of its GPUs is kept, not ready, with
    ``missing_since`` set and only those GPUs (see ``GpuDevice``).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    cluster_name = models.CharField(max_length=63, blank=True, default="", db_default="", editable=False, help_text="Copy of Cluster.name, for placement order")
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)
    gpu_mode = models.CharField(max_length=32, blank=True, default="", help_text="Label gshare.io/gpu-mode")
    ready = models.BooleanField(default=False)
    inventory_error = models.CharField(
        max_length=500, blank=True, default="", help_text="Why the operator could not decode this node's HAMi annotation"
    )
    last_seen_at = models.DateTimeField()
    missing_since = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="Left out of the operator's snapshots since then but kept (not ready) while a live session holds one of its GPUs",
    )
    load = models.PositiveIntegerField(default=0, db_default=0, editable=False, help_text="Reservations on this node's GPUs (sum of their used_count)")
    free_devices = models.PositiveIntegerField(default=0, db_default=0, editable=False, help_text="Healthy GPUs of this node with nothing reserved on them")
    open_devices = models.PositiveIntegerField(
        default=0, db_default=0, editable=False, help_text="Healthy GPUs of this node a share may still go to (not held whole, split count not reached)"
    )
    max_free_memory_mib = models.PositiveIntegerField(default=0, db_default=0, editable=False, help_text="Most MiB left on one of the open GPUs")
    max_free_cores = models.PositiveIntegerField(default=0, db_default=0, editable=False, help_text="Most core percent left on one of the open GPUs")
    cpu_allocatable_millicores = models.PositiveBigIntegerField(
        null=True, blank=True, editable=False,
        help_text="The node's allocatable CPU (status.allocatable, millicores); empty: not reported (older operators), no CPU limit")
    memory_allocatable_mib = models.PositiveBigIntegerField(
        null=True, blank=True, editable=False,
        help_text="The node's allocatable memory (status.allocatable, MiB rounded down); empty: not reported, no memory limit")
    cpu_requested_millicores = models.PositiveBigIntegerField(
        default=0, db_default=0, editable=False, help_text="CPU requested by the node's pods that are not sessions (millicores)")
    memory_requested_mib = models.PositiveBigIntegerField(
        default=0, db_default=0, editable=False, help_text="Memory requested by the node's pods that are not sessions (MiB rounded up)")

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_name_unique_per_cluster")]
        indexes = [
            # Placement order (sessions.placement): binpack takes the busiest node first, spread the idlest;
            # ties break on cluster name, then node name. Only ready nodes can take sessions. Whole-GPU
            # requests under binpack walk only the nodes with a free GPU: the busiest nodes, first in that
            # order, are mostly full, and would otherwise be read one by one on every request.
            models.Index(fields=["-load", "cluster_name", "name"], condition=Q(ready=True), name="node_binpack_order"),
            models.Index(fields=["-load", "cluster_name", "name"], condition=Q(ready=True, free_devices__gt=0), name="node_binpack_free_order"),
            models.Index(fields=["load", "cluster_name", "name"], condition=Q(ready=True), name="node_spread_order"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def reported_at(self):
        """When the operator last reported this node: its cluster's last report while the node is listed (an
        unchanged node's row is not rewritten), else ``last_seen_at`` (the last report that listed it)."""
        return _reported_at(self)

    def save(self, *args, **kwargs):
        """Fill ``cluster_name`` from the cluster when it is not set (rows made one by one, e.g. fixtures)."""
        if not self.cluster_name and self.cluster_id is not None:
            self.cluster_name = self.cluster.name
        super().save(*args, **kwargs)


def _reported_at(row):
    if row.missing_since is not None:
        return row.last_seen_at
    heartbeat = row.cluster.last_heartbeat_at
    return max(row.last_seen_at, heartbeat) if heartbeat else row.last_seen_at


#: A GPU a share may still go to: healthy, not held whole, split count not reached.
_OPEN_GPU = "d.health AND NOT d.used_exclusive AND d.used_count < d.split_count"

#: ``Node``'s placement summary: column -> SQL aggregate over the node's GPUs ``d`` (rows of
#: ``clusters_gpudevice``, or of a query with the same column names; NULLs from a LEFT JOIN count as
#: no GPU). The one definition that ``clusters.services.inventory_apply`` and
#: ``sessions.placement.usage_recompute`` both write with.
NODE_SUMMARY = {
    "load": "COALESCE(SUM(d.used_count), 0)::int",
    "free_devices": "(COUNT(d.id) FILTER (WHERE d.health AND d.used_count = 0))::int",
    "open_devices": f"(COUNT(d.id) FILTER (WHERE {_OPEN_GPU}))::int",
    "max_free_memory_mib": f"COALESCE(MAX(GREATEST(d.memory_mib - d.used_memory_mib, 0)) FILTER (WHERE {_OPEN_GPU}), 0)::int",
    "max_free_cores": f"COALESCE(MAX(GREATEST(d.cores - d.used_cores, 0)) FILTER (WHERE {_OPEN_GPU}), 0)::int",
}


def node_summary_update_sql(*, devices: str, nodes_where: str | None = None) -> str:
    """``UPDATE clusters_node`` setting the ``NODE_SUMMARY`` of nodes from ``devices`` (a table or
    CTE with the columns of ``clusters_gpudevice``), leaving the rows already right alone.

    With ``nodes_where`` (SQL on ``n2``, a ``clusters_node`` row), the nodes it matches, a node
    without GPUs counting zero; without, the nodes of the rows of ``devices``, which must then hold
    all the GPUs of each of those nodes (cheaper to plan: the hot path of placement).
    """
    columns = list(NODE_SUMMARY)
    aggregates = ", ".join(f"{sql} AS {column}" for column, sql in NODE_SUMMARY.items())
    if nodes_where is None:
        source = f"SELECT d.node_id AS id, {aggregates} FROM {devices} d GROUP BY d.node_id"
    else:
        source = f"SELECT n2.id, {aggregates} FROM clusters_node n2 LEFT JOIN {devices} d ON d.node_id = n2.id WHERE {nodes_where} GROUP BY n2.id"
    return f"""
        UPDATE clusters_node n SET {", ".join(f"{c} = x.{c}" for c in columns)}
          FROM ({source}) x
         WHERE n.id = x.id AND ({", ".join(f"n.{c}" for c in columns)}) IS DISTINCT FROM ({", ".join(f"x.{c}" for c in columns)})"""


class GpuDevice(models.Model):
    """A physical GPU on a node, decoded by the operator from HAMi's node registration annotation.

    ``memory_mib`` is HAMi's registered device memory (MiB, after ``deviceMemoryScaling``);
    ``split_count`` is how many pods may share the GPU; ``cores`` is the core capacity in percent
    of one GPU (100 = whole GPU). Format: ``hami.io/node-nvidia-register``, HAMi 2.x.

    ``used_*`` are the live reservations on the GPU (``sessions.Allocation``, summed): how many,
    MiB, core percent, and whether one of them is a whole-GPU (exclusive) reservation. They are
    only ever set by ``sessions.placement.usage_recompute``, which recomputes them from the
    allocations under the cluster's row lock; the inventory upsert never writes them.

    The database refuses inconsistent counters (negative, an exclusive reservation sharing the GPU,
    MiB or cores without a reservation). It does not refuse ``used > capacity``: the operator's
    inventory is the truth, and a GPU may be re-registered with less memory, cores or split count
    than is already reserved on it (e.g. HAMi's ``deviceMemoryScaling`` lowered). Such a GPU keeps
    its reservations (nothing is evicted) and takes no new one until enough are released: the fit
    query checks ``used + asked <= capacity``, and ``session_create`` refuses to commit a
    reservation that leaves one of its GPUs over capacity.

    A GPU left out of a snapshot while a live session holds it (a reservation, or HAMi's allocation
    as the operator reported it) is not deleted, which would drop the reservation and free the GPU
    for a second placement: it is kept with ``missing_since`` set and ``health`` false, so placement
    passes over it, until a snapshot lists it again (matched by UUID, reservations intact) or one
    comes after its sessions ended (``clusters.services.inventory_apply``). A ``Node`` likewise.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="devices")
    uuid = models.CharField(max_length=128, unique=True)
    index = models.PositiveIntegerField()
    model = models.CharField(max_length=128)
    memory_mib = models.PositiveIntegerField()
    split_count = models.PositiveIntegerField()
    cores = models.PositiveIntegerField()
    health = models.BooleanField(default=True)
    mode = models.CharField(max_length=32, blank=True, default="")
    last_seen_at = models.DateTimeField()
    missing_since = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="Left out of the operator's snapshots since then but kept (health false) while a live session holds it",
    )
    used_count = models.PositiveIntegerField(default=0, db_default=0, editable=False, help_text="Live reservations on this GPU")
    used_memory_mib = models.PositiveBigIntegerField(default=0, db_default=0, editable=False, help_text="MiB reserved on this GPU")
    used_cores = models.PositiveIntegerField(default=0, db_default=0, editable=False, help_text="Core percent reserved on this GPU")
    used_exclusive = models.BooleanField(default=False, db_default=False, editable=False, help_text="Held whole by one session")

    class Meta:
        verbose_name = "GPU device"
        verbose_name_plural = "GPU devices"
        ordering = ["cluster_id", "node_id", "index"]
        constraints = [
            models.CheckConstraint(condition=Q(split_count__gte=1), name="gpu_split_count_positive"),
            # used_* >= 0: the Positive*Field columns carry that check already.
            models.CheckConstraint(condition=Q(used_exclusive=False) | Q(used_count=1), name="gpu_usage_exclusive_alone"),
            models.CheckConstraint(
                condition=~Q(used_count=0) | (Q(used_memory_mib=0) & Q(used_cores=0) & Q(used_exclusive=False)),
                name="gpu_usage_empty_when_unused",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.uuid}"

    @property
    def reported_at(self):
        """When the operator last reported this GPU (as ``Node.reported_at``)."""
        return _reported_at(self)


class ClusterGpuModel(models.Model):
    """A GPU model present on a cluster, with the smallest registered memory among its GPUs of that model.

    A summary of ``GpuDevice`` (every row, healthy or not, as admission has always counted them) that admission
    reads to price a request on its candidate clusters (``billing.admission``): one row per cluster and model instead
    of probing the GPU rows of every candidate. Kept by triggers on ``clusters_gpudevice``
    (``migrations/0015_cluster_gpu_models.py``): every statement that inserts or deletes GPUs, or changes their
    cluster, model or memory, recomputes the rows of the clusters it touched, in its own transaction, so the summary
    is never staler than the GPU rows a reader sees. Never written by the application.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    model = models.CharField(max_length=128)
    memory_mib = models.PositiveIntegerField()

    class Meta:
        verbose_name = "cluster GPU model"
        constraints = [models.UniqueConstraint(fields=["cluster", "model"], name="cluster_gpu_model_once")]

    def __str__(self) -> str:
        return f"{self.model} ({self.memory_mib} MiB)"
