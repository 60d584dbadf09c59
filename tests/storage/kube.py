"""One emulated apiserver for storage tests that register pools on factory clusters.

Registering a pool reads its StorageClass on the pool's cluster (``storage.services.pool_check_storage_class``); a
factory cluster's apiserver is a closed port, so these tests point the pool's cluster at this emulator, which serves
the StorageClasses they name (``STORAGE_CLASSES``). It starts on first use and stops at the end of the test session
(``tests/storage/conftest.py``).
"""

from __future__ import annotations

import atexit

import yaml

from clusters.models import Cluster
from demo.emulator import EmulatedCluster
from tests.factories import ClusterFactory

#: The StorageClasses the emulator serves.
STORAGE_CLASSES = ("gshare-nfs", "nfs-a", "nfs-b", *(f"nfs-{i}" for i in range(10)))

_running: list[EmulatedCluster] = []


def storage_class(name: str, provisioner: str = "org.democratic-csi.nfs") -> dict:
    """A StorageClass object as ``kubectl get -o json`` shows it."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}


def storage_apiserver() -> EmulatedCluster:
    """The shared emulator (started on first use)."""
    if not _running:
        server = EmulatedCluster([storage_class(name) for name in STORAGE_CLASSES], token="storage-tests")
        server.start()
        _running.append(server)
        atexit.register(stop_storage_apiserver)  # tests outside tests/storage use it too (no session fixture there)
    return _running[0]


def stop_storage_apiserver() -> None:
    """Stop the shared emulator if it was started."""
    while _running:
        _running.pop().stop()


def reachable(cluster: Cluster) -> Cluster:
    """``cluster`` (a factory row) with its kubeconfig pointed at the shared emulator; returns it reloaded."""
    server = storage_apiserver()
    Cluster.objects.filter(pk=cluster.pk).update(apiserver_url=server.url, kubeconfig=yaml.safe_dump(server.kubeconfig("storage")))
    cluster.refresh_from_db()
    return cluster


def pool_cluster(**fields) -> Cluster:
    """A factory cluster whose apiserver serves ``STORAGE_CLASSES`` (a pool may be registered on it)."""
    return reachable(ClusterFactory(**fields))
