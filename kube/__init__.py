"""Kubernetes API access of the control plane: the only package of it that imports the ``kubernetes`` client.

* ``kube.client``: ``ApiClient``s built from stored kubeconfigs, and the :class:`Deadline` that bounds a call
  as a whole;
* ``kube.gateway``: :class:`KubeGateway`, the calls themselves (get, list, create, replace, patch,
  server-side apply, delete), objects as dicts;
* ``kube.errors``: the gateway's two errors, :class:`KubeUnavailable` (transient) and :class:`KubeRefused`.
"""

from kube.client import (
    Deadline,
    DeadlineExceeded,
    api_client_for_cluster,
    api_client_for_kubeconfig,
    guard_pools,
    tls_failure_detail,
)
from kube.errors import KubeError, KubeRefused, KubeUnavailable, status_message
from kube.gateway import FIELD_MANAGER, KubeGateway, Resource, parse_quantity

__all__ = [
    "FIELD_MANAGER",
    "Deadline",
    "DeadlineExceeded",
    "KubeError",
    "KubeGateway",
    "KubeRefused",
    "KubeUnavailable",
    "Resource",
    "api_client_for_cluster",
    "api_client_for_kubeconfig",
    "guard_pools",
    "parse_quantity",
    "status_message",
    "tls_failure_detail",
]
