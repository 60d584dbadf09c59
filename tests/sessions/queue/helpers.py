"""What the queue's tests share: their instant, image and GPU model, and starting and ending a session through the
services."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.services import policy_set
from sessions import create, lifecycle, placement
from sessions.models import Session
from sessions.queue.plan import Device, Job, Node, Outcome
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
IMAGE = "quay.io/jupyter/base-notebook"
H100 = "NVIDIA H100 80GB HBM3"


def start(owner, **body) -> Session:
    """``sessions.create.session_create`` for ``owner``: one GPU of any model unless ``body`` says otherwise."""
    return create.session_create(owner=owner, image=IMAGE, **{"gpus": 1, **body})


def end(session: Session) -> None:
    """Terminate ``session`` as its release path does."""
    lifecycle.session_terminate(session=Session.objects.get(pk=session.pk), message="ended")


def queue_user(**policy):
    """A user whose policy needs no credits, allows 24-hour sessions and 10 queued ones, then ``policy``."""
    user = UserFactory()
    policy_set(user=user, **{"min_balance_hours": Decimal(0), "max_runtime_hours": Decimal(24), "max_queued_sessions": 10, **policy})
    return user


def queued_session(**fields) -> Session:
    """A ``Queued`` session row (one GPU unless ``fields`` say otherwise), written directly, not through the services."""
    return SessionFactory(cluster=None, phase=Session.Phase.QUEUED, **{"gpus": 1, **fields})


def planned_outcome(node, session, devices) -> Outcome:
    """The plan's ``Outcome`` starting ``session`` now on ``node``'s ``devices`` (``GpuDevice`` rows, as the plan saw them)."""
    plan_node = Node(pk=node.pk, name=node.name, cluster_id=node.cluster_id, cluster_name=node.cluster.name, devices=[])
    return Outcome(job=Job(key=session.pk, public_id=session.public_id, gpus=session.gpus), now=True, node=plan_node,
                   devices=[Device(pk=d.pk, model=d.model, memory_mib=d.memory_mib, cores=d.cores, split_count=d.split_count)
                            for d in devices])


def one_node_cluster(name: str, *, gpus: int = 4):
    """A cluster ``name`` with one node (``<name>-node``) of ``gpus`` H100s split in 4, its counters recounted."""
    cluster = ClusterFactory(name=name)
    node = NodeFactory(cluster=cluster, name=f"{name}-node")
    for i in range(gpus):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=81559, cores=100, model=H100)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster
