"""factory_boy factories for control-plane models (rows made directly, without probing)."""

import factory
import yaml
from django.utils import timezone

from clusters.models import Cluster, GpuDevice, Node

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
