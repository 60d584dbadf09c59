"""Probing a cluster's apiserver from the control plane: reachable, RuntimeClass, HAMi, GPU nodes,
and the cluster's identity (the ``kube-system`` namespace's ``metadata.uid``).

Used by registration (which refuses a cluster that fails a required check), by the connection
test (which reports every check) and by a change of a cluster's kubeconfig (which must reach the
same cluster). All calls share one time budget (``GSHARE_PROBE_TIMEOUT``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from clusters.errors import CLUSTER_AUTH_FAILED, CLUSTER_UNREACHABLE
from contract import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE
from core.exceptions import ApplicationError
from kube import Deadline, KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import DAEMON_SETS, NAMESPACES, NODES, RUNTIME_CLASSES
from kube.kubeconfig import KubeconfigError

logger = logging.getLogger(__name__)

#: Labels by which the HAMi chart marks its NVIDIA device-plugin DaemonSet
#: (charts/hami/templates/device-plugin/daemonsetnvidia.yaml, HAMi 2.x).
HAMI_DEVICE_PLUGIN_COMPONENT = "hami-device-plugin"
#: The namespace whose ``metadata.uid`` identifies a cluster: created once with the cluster, never renamed.
IDENTITY_NAMESPACE = "kube-system"
#: What the credential needs to read it (docs/attach-a-cluster.md).
IDENTITY_RBAC_FIX = (
    "give the kubeconfig's ServiceAccount `get` on the namespace kube-system: "
    "`kubectl create clusterrole gshare-control-plane-identity --verb=get --resource=namespaces --resource-name=kube-system` "
    "and bind it (docs/attach-a-cluster.md)"
)


class ClusterUnreachable(ApplicationError):
    """504: the apiserver did not answer within the probe's time budget."""

    code = CLUSTER_UNREACHABLE
    status = 504


class ClusterAuthFailed(ApplicationError):
    """400: the apiserver refused the kubeconfig's credentials (401) or lacks a permission (403)."""

    code = CLUSTER_AUTH_FAILED
    status = 400


@dataclass
class ProbeResult:
    """What the probe saw.

    Attributes:
        checks: check name -> passed (``apiserver_reachable``, ``runtime_class_nvidia``,
            ``hami_device_plugin``, ``gpu_nodes``; ``credential_least_privilege`` unless the apiserver could not
            answer a SelfSubjectAccessReview).
        details: check name -> sentence naming the fix, for each failed check.
        kubernetes_version: ``gitVersion`` from ``/version`` (e.g. ``v1.32.3``), or "".
        gpu_node_count: nodes labelled ``gpu=on``.
        kube_system_uid: ``metadata.uid`` of the ``kube-system`` namespace (the cluster's identity), or ""
            when it could not be read (see ``identity_forbidden``; a server without that namespace leaves
            both empty).
        identity_forbidden: the sentence naming the fix when the credential may not read ``kube-system``
            (403), else "". Not a check: the connection test of a cluster registered with an older
            ClusterRole keeps working.
    """

    checks: dict[str, bool] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    kubernetes_version: str = ""
    gpu_node_count: int = 0
    kube_system_uid: str = ""
    identity_forbidden: str = ""

    def fail(self, name: str, detail: str) -> None:
        """Record a failed check with the sentence that names its fix."""
        self.checks[name] = False
        self.details[name] = detail


def _unreachable_detail(server: str, seconds: float, exc: KubeUnavailable) -> str:
    """Why registration "hangs, then fails": the probe dials from the control plane's pods, not from where the request
    was sent, so the address must be reachable from there within ``GSHARE_PROBE_TIMEOUT``."""
    why = "the connection was cut off at the deadline" if exc.deadline_exceeded else exc.cause_name
    return (
        f"The apiserver at {server} did not answer within {seconds:g} s, the probe's time budget (GSHARE_PROBE_TIMEOUT): "
        f"no complete answer came in that time ({why}). The probe dials it from the control plane's pods, not from your "
        f"machine, so that address must be reachable from them: try it from a control plane pod (`kubectl exec "
        f"deploy/gshare-api -- python -c \"import requests; print(requests.get('{server}/version', verify=False, "
        f"timeout={seconds:g}).status_code)\"`, gshare-api being the chart's api Deployment), open the firewall or VPN "
        "between them, put the apiserver's routable address in the kubeconfig (not 127.0.0.1 or a tunnel on your "
        "machine), and check that the cluster is up."
    )


def probe_cluster(config: dict, *, server: str, timeout: float) -> ProbeResult:
    """Run every check against the apiserver named in ``config``.

    Args:
        config: validated kubeconfig dict (see ``kube.kubeconfig.validate_kubeconfig``).
        server: its apiserver URL (for messages).
        timeout: the whole budget for all calls, seconds.

    Every call is bounded as a whole by what is left of ``timeout`` (``Deadline.call``): a server that
    trickles its answer is cut off when the budget is spent and reported as not answering.

    Returns:
        A ``ProbeResult``; ``apiserver_reachable`` is False (and the other checks absent) when
        the apiserver did not answer completely in time.

    Raises:
        ClusterAuthFailed: the apiserver answered 401 to ``/version``-authenticated calls.
        KubeconfigError: ``kubeconfig_invalid``: the client library cannot use the kubeconfig, or TLS failed
            because of it (certificate data that cannot be used, a server certificate that does not verify
            against ``certificate-authority-data``, a server that does not speak TLS).
    """
    result = ProbeResult()
    with KubeGateway.for_kubeconfig(config, server=server, deadline=Deadline(timeout)) as kube:
        try:
            result.kubernetes_version = str(kube.version().get("gitVersion") or "")
            result.checks["apiserver_reachable"] = True
            _read_identity(kube, result, server=server)
            _check_least_privilege(kube, result)

            if kube.get(RUNTIME_CLASSES, "nvidia", missing_ok=True) is not None:
                result.checks["runtime_class_nvidia"] = True
            else:
                result.fail(
                    "runtime_class_nvidia",
                    "The cluster has no RuntimeClass `nvidia`: prepare it with the attach command "
                    "(`hack/attach-cluster.sh`, docs/attach.md: it installs the runtime class, HAMi and the rest), or by "
                    "hand: install the NVIDIA container toolkit on the GPU nodes and create the RuntimeClass "
                    "(`kubectl apply -f` the one in docs/attach-a-cluster.md, step 1).",
                )

            hami = [ds for ds in kube.list(DAEMON_SETS) if _is_hami_device_plugin(ds)]
            if hami:
                result.checks["hami_device_plugin"] = True
            else:
                result.fail(
                    "hami_device_plugin",
                    "No HAMi device-plugin DaemonSet was found: prepare the cluster with the attach command "
                    "(`hack/attach-cluster.sh`, docs/attach.md), or by hand install HAMi "
                    "(`helm install hami hami-charts/hami -n kube-system`, docs/attach-a-cluster.md step 1) so GPUs can be "
                    "shared and reported.",
                )

            nodes = kube.list(NODES, label_selector=f"{GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}")
            result.gpu_node_count = len(nodes)
            if nodes:
                result.checks["gpu_nodes"] = True
            else:
                result.fail(
                    "gpu_nodes",
                    f"No node is labelled `{GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}`: label each GPU node "
                    f"(`kubectl label node <node> {GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}`).",
                )
        except KubeUnavailable as exc:
            if exc.status:
                result.fail("apiserver_reachable", _answered_detail(server, exc))
            elif exc.tls_detail:
                raise KubeconfigError(exc.tls_detail) from None
            else:
                result.fail("apiserver_reachable", _unreachable_detail(server, timeout, exc))
        except KubeRefused as exc:
            if exc.unreadable:  # e.g. a /version body that is not Kubernetes'
                result.fail(
                    "apiserver_reachable",
                    f"{server} answered, but not as a Kubernetes apiserver ({exc.message}): check that the URL is the apiserver's.",
                )
            elif exc.status in (401, 403):
                raise ClusterAuthFailed(
                    f"The apiserver at {server} answered {exc.status} ({exc.reason}): the kubeconfig's credentials are "
                    "refused or lack permissions; give its ServiceAccount read access to nodes, daemonsets and runtimeclasses "
                    "(the ClusterRole in docs/attach-a-cluster.md)."
                ) from None
            else:
                result.fail("apiserver_reachable", _answered_detail(server, exc))
    return result


def _answered_detail(server: str, exc: KubeRefused | KubeUnavailable) -> str:
    return f"The apiserver at {server} answered {exc.status} ({exc.reason}); check that the URL is the apiserver's."


def _read_identity(kube: KubeGateway, result: ProbeResult, *, server: str) -> None:
    """Fill ``result.kube_system_uid`` (or ``identity_forbidden`` on 403); a 404 leaves both empty.

    Raises:
        KubeRefused, KubeUnavailable: any other failure (handled by ``probe_cluster`` like the other calls).
    """
    try:
        namespace = kube.get(NAMESPACES, IDENTITY_NAMESPACE, missing_ok=True)
    except KubeRefused as exc:
        if exc.status == 403:
            result.identity_forbidden = (
                f"The apiserver at {server} answered 403 to reading the namespace {IDENTITY_NAMESPACE}, whose uid identifies "
                f"the cluster: {IDENTITY_RBAC_FIX}."
            )
            return
        raise
    uid = ((namespace or {}).get("metadata") or {}).get("uid") or ""
    result.kube_system_uid = str(uid)[:64]


#: Why a cluster-admin credential is reported, and its fix.
LEAST_PRIVILEGE_FIX = (
    "The stored credential may do anything on the cluster (a SelfSubjectAccessReview of verb `*` on `*` is allowed: "
    "cluster-admin), while the control plane needs only the rights listed in docs/attach.md. Fix: re-run "
    "`manage.py attach_cluster` with the admin credential (it creates the ServiceAccount gshare-system/gshare-control-plane "
    "and registers its token in place of this one; the cluster keeps its id), or register that ServiceAccount's token "
    "by hand (docs/attach-a-cluster.md)."
)


def _check_least_privilege(kube: KubeGateway, result: ProbeResult) -> None:
    """``credential_least_privilege``: False when the credential may do ``*`` on ``*`` (SelfSubjectAccessReview, open to
    every authenticated user). Left out when the apiserver refuses the review (4xx), answers it with an error (5xx,
    429: the check is advisory, so it does not make the apiserver unreachable) or with something that is not a review
    status: nothing is known then.

    Raises:
        KubeUnavailable: no answer at all (from the gateway, handled by ``probe_cluster``).
    """
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}}
    try:
        answer = kube.create(review) or {}
    except KubeRefused:
        return
    except KubeUnavailable as exc:
        if exc.status:
            return
        raise
    status = answer.get("status")
    if not isinstance(status, dict) or not isinstance(status.get("allowed"), bool):
        return
    if status["allowed"] is True:
        result.fail("credential_least_privilege", LEAST_PRIVILEGE_FIX)
    else:
        result.checks["credential_least_privilege"] = True


def _is_hami_device_plugin(daemonset: dict) -> bool:
    metadata = daemonset.get("metadata") or {}
    labels = metadata.get("labels") or {}
    name = metadata.get("name") or ""
    return labels.get("app.kubernetes.io/component") == HAMI_DEVICE_PLUGIN_COMPONENT or "hami-device-plugin" in name
