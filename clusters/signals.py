"""What clusters announce to the apps above them (sessions), which subscribe: clusters imports none of them.

Each signal is sent by ``clusters.services`` with ``sender=Cluster`` and ``cluster=`` the cluster, inside the
service's transaction and under the cluster's row lock (placement takes the same lock, so no session lands on the
cluster while a receiver looks). A receiver answers through its return value; what it does after the commit
(publishing tasks) it schedules itself with ``transaction.on_commit``. ``sessions.apps`` connects the receivers.
"""

from __future__ import annotations

from django.dispatch import Signal

from clusters.models import Cluster

#: ``cluster_update`` changed what sessions are reached through (``clusters.routing_mode.routing_key``: the routing mode or
#: the Gateway). Each receiver marks what must follow the new routing, durably and in the caller's transaction, and
#: returns how many it marked (int); the sum is the update's ``sessions_reapplied``.
cluster_routing_changed = Signal()

#: ``cluster_update`` is about to change the cluster's ``session_domain`` (kwarg ``domain``, the new value). Each
#: receiver returns the ids of what still uses the current domain (live sessions, oldest first; a list of str); any id
#: refuses the change with ``cluster_has_live_sessions``.
session_domain_changing = Signal()

#: ``cluster_deregister`` is about to drop the cluster's nodes and GPUs. Each receiver returns how many live things
#: (sessions, GPU allocations) still hold the cluster (int); a non-zero sum refuses with ``cluster_busy``.
cluster_deregistering = Signal()

#: ``inventory_apply`` replaced the cluster's nodes and GPUs: GPUs may have been added, or healed, or nodes become ready.
#: Receivers schedule what follows after the commit (the queue's pass); their answers are not read.
capacity_changed = Signal()


def answers(signal: Signal, *, cluster: Cluster, **kwargs) -> list:
    """Send ``signal`` for ``cluster`` and return its receivers' answers, in the order they were connected.

    A receiver's exception is not caught: it propagates to the caller (and rolls its transaction back).
    """
    return [answer for _, answer in signal.send(sender=Cluster, cluster=cluster, **kwargs)]
