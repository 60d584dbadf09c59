"""factory_boy factories for control-plane models (rows made directly, without probing)."""

import factory
import yaml
from django.utils import timezone

from clusters.models import Cluster, GpuDevice, Node
from core.ids import new_volume_id

KUBECONFIG = yaml.safe_dump({
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],  # loopback, closed: never another host
    "users": [{"name": "u", "user": {"token": "factory-token"}}],
    "contexts": [{"name": "u@c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "u@c",
})


class ClusterFactory(factory.django.DjangoModelFactory):
    """A connected cluster whose apiserver is never dialled by the tests that use it."""

    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n}")
    apiserver_url = "http://127.0.0.1:9"
    kubeconfig = KUBECONFIG
    session_domain = factory.LazyAttribute(lambda o: f"{o.name}.gpu.example.com")
    status = Cluster.Status.CONNECTED
    kubernetes_version = "v1.32.3"


class NodeFactory(factory.django.DjangoModelFactory):
    """A ready GPU node."""

    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"gpu-node-{n:03d}")
    labels = factory.LazyFunction(lambda: {"gpu": "on", "gshare.io/gpu-mode": "hami-core"})
    gpu_mode = "hami-core"
    ready = True
    last_seen_at = factory.LazyFunction(timezone.now)


class GpuDeviceFactory(factory.django.DjangoModelFactory):
    """An H100 as HAMi v2.10 registers it."""

    class Meta:
        model = GpuDevice

    node = factory.SubFactory(NodeFactory)
    cluster = factory.LazyAttribute(lambda o: o.node.cluster)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08x}-0000-0000-0000-000000000000")
    index = factory.Sequence(lambda n: n % 8)
    model = "NVIDIA H100 80GB HBM3"
    memory_mib = 81559
    split_count = 10
    cores = 100
    health = True
    last_seen_at = factory.LazyFunction(timezone.now)


class UserFactory(factory.django.DjangoModelFactory):
    """A researcher (not staff)."""

    class Meta:
        model = "auth.User"
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user-{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.com")


class SessionFactory(factory.django.DjangoModelFactory):
    """A Running whole-GPU session on a factory cluster (no allocation; add volumes with ``volumes=[...]``)."""

    class Meta:
        model = "gpu_sessions.Session"
        skip_postgeneration_save = True

    owner = factory.SubFactory(UserFactory)
    cluster = factory.SubFactory(ClusterFactory)
    image = "quay.io/jupyter/base-notebook"
    gpus = 1
    phase = "Running"

    @factory.post_generation
    def volumes(self, create, extracted, **kwargs):
        """``SessionFactory(volumes=[volume, ...])`` mounts them (``Session.volumes``)."""
        if create and extracted:
            self.volumes.set(extracted)


class StoragePoolFactory(factory.django.DjangoModelFactory):
    """A pool shared with every cluster, stated at 1024 GiB (its capacity is stored only by the services)."""

    class Meta:
        model = "storage.StoragePool"

    name = factory.Sequence(lambda n: f"pool-{n}")
    cluster = factory.SubFactory(ClusterFactory)
    storage_class = "nfs-a"
    sharing = "all"
    manual_capacity_gb = 1024


class VolumeFactory(factory.django.DjangoModelFactory):
    """A 10 GiB volume, not mounted yet (``claim_name`` as ``volume_create`` sets it)."""

    class Meta:
        model = "storage.Volume"

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"vol-{n}")
    quota_gb = 10
    pool = factory.SubFactory(StoragePoolFactory)
    public_id = factory.LazyFunction(new_volume_id)
    claim_name = factory.LazyAttribute(lambda o: "gshare-" + o.public_id.replace("_", "-"))


class StorageCapacityReadingFactory(factory.django.DjangoModelFactory):
    """A fresh CSIStorageCapacity reading of ``nfs-a`` (2 TiB, one object)."""

    class Meta:
        model = "storage.StorageCapacityReading"

    cluster = factory.SubFactory(ClusterFactory)
    storage_class = "nfs-a"
    capacity_bytes = 2 * 1024**4
    object_count = 1
    read_at = factory.LazyFunction(timezone.now)


class NodeDiskFactory(factory.django.DjangoModelFactory):
    """A node's system drive (500 GiB)."""

    class Meta:
        model = "storage.NodeDisk"

    cluster = factory.SubFactory(ClusterFactory)
    node = factory.Sequence(lambda n: f"storage-node-{n}")
    disk_bytes = 500 * 1024**3
    read_at = factory.LazyFunction(timezone.now)
