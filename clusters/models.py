"""Data-plane clusters, their GPU nodes and GPU devices (as reported by each cluster's operator)."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from gshare.crypto import EncryptedTextField
from gshare.ids import new_cluster_id

#: RFC 1123 DNS name (what Kubernetes calls a DNS subdomain): lowercase labels of letters, digits and '-'.
dns_name_validator = RegexValidator(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$",
    message="must be a lowercase DNS name (RFC 1123), e.g. gpu-a.example.com",
    code="invalid_dns_name",
)


class Cluster(models.Model):
    """A registered data-plane Kubernetes cluster.

    ``kubeconfig`` is the credential the control plane uses to reach the cluster's apiserver; it is
    encrypted at rest (MultiFernet), never returned by the API and never shown in the console.
    A deregistered cluster keeps its row (status ``deregistered``) so history stays readable; its
    name becomes free for a new registration.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending (registered, waiting for the operator's first report)"
        CONNECTED = "connected", "Connected"
        DEGRADED = "degraded", "Degraded"
        UNREACHABLE = "unreachable", "Unreachable"
        DEREGISTERED = "deregistered", "Deregistered"

    public_id = models.CharField(max_length=24, unique=True, default=new_cluster_id, editable=False)
    name = models.CharField(max_length=63)
    apiserver_url = models.CharField(max_length=512)
    kubeconfig = EncryptedTextField()
    session_domain = models.CharField(max_length=253, blank=True, default="", validators=[dns_name_validator])
    ingress_node = models.CharField(max_length=253, blank=True, default="", validators=[dns_name_validator])
    volume_storage_class = models.CharField(max_length=253, blank=True, default="", validators=[dns_name_validator])
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    kubernetes_version = models.CharField(max_length=64, blank=True, default="")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_connection_test = models.JSONField(null=True, blank=True)
    last_connection_test_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    deregistered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=~Q(status="deregistered"), name="cluster_name_unique_while_registered"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class Node(models.Model):
    """A GPU node of a cluster (label ``gpu=on``), as in the operator's latest inventory snapshot."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)
    gpu_mode = models.CharField(max_length=32, blank=True, default="", help_text="Label gshare.io/gpu-mode")
    ready = models.BooleanField(default=False)
    inventory_error = models.CharField(
        max_length=500, blank=True, default="", help_text="Why the operator could not decode this node's HAMi annotation"
    )
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_name_unique_per_cluster")]

    def __str__(self) -> str:
        return self.name


class GpuDevice(models.Model):
    """A physical GPU on a node, decoded by the operator from HAMi's node registration annotation.

    ``memory_mib`` is HAMi's registered device memory (MiB, after ``deviceMemoryScaling``);
    ``split_count`` is how many pods may share the GPU; ``cores`` is the core capacity in percent
    of one GPU (100 = whole GPU). Format: ``hami.io/node-nvidia-register``, HAMi 2.x.
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

    class Meta:
        ordering = ["cluster_id", "node_id", "index"]
        constraints = [
            models.CheckConstraint(condition=Q(split_count__gte=1), name="gpu_split_count_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.uuid}"
