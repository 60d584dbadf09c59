"""The Helm releases ``attach_cluster`` installs: chart, repository, version and values, as plain data.

Each function returns a :class:`ChartRelease`; :mod:`attach.helm` installs it. Keeping the plan apart
from the installing lets the tests check the exact releases and values a real cluster would get.

Chart repositories and versions come from settings (``GSHARE_ATTACH_*``, docs/configuration.md), so an
operator can pin other releases or point at a mirror.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from attach.errors import ATTACH_INPUT_INVALID
from core.exceptions import ApplicationError

OPERATOR_CHART = Path(settings.BASE_DIR) / "charts" / "gshare-operator"
OPERATOR_RELEASE = "gshare-operator"
#: ``GatewayClass.spec.controllerName`` of Envoy Gateway (its chart's ``config.envoyGateway.gateway.controllerName``).
ENVOY_GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
#: The democratic-csi release, where ``hack/cluster-bootstrap.sh storage`` installs it too: attach's
#: ``--storage-values`` then upgrades that same release (``helm -n gshare-storage get values gshare-storage``
#: gives the values back) instead of a second release claiming the same CSIDriver and StorageClass.
STORAGE_RELEASE = "gshare-storage"
STORAGE_NAMESPACE = "gshare-storage"


def operator_namespace() -> str:
    """Namespace of the operator, its token Secret and the check pods (``GSHARE_OPERATOR_NAMESPACE``)."""
    return settings.GSHARE_OPERATOR_NAMESPACE


@dataclass(frozen=True)
class ChartRelease:
    """One Helm release to install or upgrade.

    Attributes:
        release: release name (``hami``, ``ingress-nginx``, ``gshare-storage``, ``gshare-operator``).
        namespace: namespace of the release (created when missing).
        chart: chart name in ``repo_url``, or a local chart directory when ``repo_url`` is empty.
        repo_url: chart repository URL (``index.yaml`` lives there), an ``oci://`` registry base (the chart is
            ``<repo_url>/<chart>``), or "" for a local chart.
        version: chart version to install ("" for a local chart: its own version).
        values: the values passed to Helm (never printed: they may hold secrets).
        secret_values: True when ``values`` came from an operator's file that may hold credentials.
        what: one line for the progress output.
    """

    release: str
    namespace: str
    chart: str
    repo_url: str
    version: str
    values: dict[str, Any] = field(default_factory=dict)
    secret_values: bool = False
    what: str = ""

    @property
    def chart_ref(self) -> str:
        """The chart as ``helm install`` names it: ``oci://<registry base>/<chart>`` for an OCI repository, else
        ``chart`` (a name in ``repo_url``, or a local directory)."""
        if self.repo_url.startswith("oci://"):
            return f"{self.repo_url.rstrip('/')}/{self.chart}"
        return self.chart


class AttachInputError(ApplicationError):
    """400: a flag or a values file cannot be used; the message names it and the fix."""

    code = ATTACH_INPUT_INVALID


_KUBE_TAG = re.compile(r"^(v\d+\.\d+\.\d+)")


def kube_scheduler_tag(git_version: str) -> str:
    """The ``kube-scheduler`` image tag matching a cluster's ``/version`` ``gitVersion``.

    Args:
        git_version: e.g. ``v1.32.3``, ``v1.34.1+k3s1``, ``v1.30.4-eks-a737599``.

    Returns:
        ``vMAJOR.MINOR.PATCH`` (the part HAMi's own ``resolvedKubeSchedulerTag`` helper keeps from v2.5.2 on).

    Raises:
        AttachInputError: the version does not start with ``vX.Y.Z``.
    """
    match = _KUBE_TAG.match(git_version or "")
    if not match:
        raise AttachInputError(f"The cluster reports Kubernetes version {git_version!r}, which is not vX.Y.Z...: "
                               "cannot pin HAMi's kube-scheduler image to it.")
    return match.group(1)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def hami_scheduler_values(chart_version: str, git_version: str) -> dict[str, Any]:
    """The HAMi chart values that pin its ``kube-scheduler`` image to the cluster's Kubernetes version.

    The key differs between chart versions (``charts/hami/values.yaml`` and ``templates/scheduler`` of
    Project-HAMi/HAMi; see tests/fixtures/hami/README.md section 5): up to v2.4.0 and from v2.5.0 to v2.6.x
    ``scheduler.kubeScheduler.imageTag``; from v2.7.0 ``scheduler.kubeScheduler.image.tag``. v2.4.1 has no
    key (it uses the apiserver's version verbatim, which breaks on ``+k3s1``), so it is refused.

    Args:
        chart_version: HAMi chart version, e.g. ``2.10.0``.
        git_version: the cluster's ``gitVersion``.

    Returns:
        ``{"scheduler": {"kubeScheduler": {...}}}``.

    Raises:
        AttachInputError: chart v2.4.1, or an unusable Kubernetes version.
    """
    tag = kube_scheduler_tag(git_version)
    version = _version_tuple(chart_version)
    if version == (2, 4, 1):
        raise AttachInputError("HAMi chart 2.4.1 cannot pin its kube-scheduler image (it has no values key for it): "
                               "set GSHARE_ATTACH_HAMI_CHART_VERSION to 2.4.0 or 2.5.0 and newer.")
    if version >= (2, 7, 0):
        return {"scheduler": {"kubeScheduler": {"image": {"tag": tag}}}}
    return {"scheduler": {"kubeScheduler": {"imageTag": tag}}}


def hami_release(git_version: str) -> ChartRelease:
    """HAMi (GPU sharing: scheduler extender, device plugin) in ``kube-system``, pinned to ``git_version``.

    Args:
        git_version: the cluster's ``gitVersion`` (``/version``).

    Returns:
        The release of chart ``hami`` from ``GSHARE_ATTACH_HAMI_REPO`` at ``GSHARE_ATTACH_HAMI_CHART_VERSION``.
        Its device plugin runs on nodes labelled ``gpu=on`` (the chart's default node selector).
    """
    version = settings.GSHARE_ATTACH_HAMI_CHART_VERSION
    values = hami_scheduler_values(version, git_version)
    tag = kube_scheduler_tag(git_version)
    return ChartRelease(release="hami", namespace="kube-system", chart="hami", repo_url=settings.GSHARE_ATTACH_HAMI_REPO,
                        version=version, values=values, what=f"HAMi {version} (kube-scheduler {tag})")


def ingress_nginx_release(ingress_node: str) -> ChartRelease:
    """ingress-nginx on ``ingress_node``, on the node's own network (ports 80 and 443 of that host).

    Session URLs are ``https://<session domain>/...`` and the session domain resolves to the ingress node,
    so the controller runs there with ``hostNetwork`` and is the cluster's default IngressClass ``nginx``.

    Args:
        ingress_node: node name (``kubernetes.io/hostname``).

    Returns:
        The release of chart ``ingress-nginx`` from ``GSHARE_ATTACH_INGRESS_NGINX_REPO``.
    """
    version = settings.GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION
    values = {
        "controller": {
            "nodeSelector": {"kubernetes.io/hostname": ingress_node, "kubernetes.io/os": "linux"},
            "hostNetwork": True,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "service": {"type": "ClusterIP"},
            "ingressClassResource": {"name": "nginx", "default": True},
            "allowSnippetAnnotations": False,
        },
    }
    return ChartRelease(release="ingress-nginx", namespace="ingress-nginx", chart="ingress-nginx",
                        repo_url=settings.GSHARE_ATTACH_INGRESS_NGINX_REPO, version=version, values=values,
                        what=f"ingress-nginx {version} on {ingress_node}")


#: Envoy Gateway's release and namespace, as its install guide names them (``helm install eg
#: oci://docker.io/envoyproxy/gateway-helm -n envoy-gateway-system``), so a cluster that followed the guide and one
#: gShare attached look the same.
ENVOY_GATEWAY_RELEASE = "eg"
ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"


def envoy_proxy_defaults(ingress_node: str) -> dict[str, Any]:
    """Envoy Gateway's default ``EnvoyProxy`` spec (``config.envoyGateway.envoyProxy``, Envoy Gateway v1.9.0
    ``EnvoyGateway.envoyProxy``): the Envoy of every Gateway runs on ``ingress_node`` on the host's network, binding the
    listener ports themselves (80, 443), as ingress-nginx does there.

    The session domain resolves to the ingress node, as for ingress-nginx. ``useListenerPortAsContainerPort`` turns
    off Envoy Gateway's shifting of privileged ports (80 -> 10080), so the container runs as root with only
    ``NET_BIND_SERVICE`` (its image has no file capability to bind them as a user). One replica with ``Recreate``: two
    pods on one host network would fight over the ports during a rolling update.

    Returns:
        An ``EnvoyProxySpec`` mapping (``provider.kubernetes``: ``envoyDeployment`` with node selector, ``Recreate``
        strategy, a strategic-merge patch setting ``hostNetwork``; ``envoyService.type: ClusterIP``).
    """
    return {
        "provider": {
            "type": "Kubernetes",
            "kubernetes": {
                "useListenerPortAsContainerPort": True,
                "envoyDeployment": {
                    "replicas": 1,
                    "strategy": {"type": "Recreate"},
                    "pod": {"nodeSelector": {"kubernetes.io/hostname": ingress_node, "kubernetes.io/os": "linux"}},
                    "container": {"securityContext": {
                        "runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                    }},
                    "patch": {"type": "StrategicMerge", "value": {"spec": {"template": {"spec": {
                        "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}}}}},
                },
                "envoyService": {"type": "ClusterIP"},
            },
        },
    }


def envoy_gateway_release(ingress_node: str) -> ChartRelease:
    """Envoy Gateway (chart ``gateway-helm``, with its Gateway API and Envoy Gateway CRDs) in ``envoy-gateway-system``.

    Values (``charts/gateway-helm/values.tmpl.yaml`` of envoyproxy/gateway v1.9.0): ``config.envoyGateway`` keeps the
    chart's ``gateway.controllerName`` and ``provider``, turns on ``extensionApis.enableBackend`` (gShare's
    SecurityPolicy ext auth reaches the control plane through a ``Backend``, which Envoy Gateway ignores otherwise)
    and sets the default ``envoyProxy`` (:func:`envoy_proxy_defaults`: on ``ingress_node``'s host network).

    Args:
        ingress_node: node name (``kubernetes.io/hostname``) the session domain resolves to.

    Returns:
        The release ``eg`` of chart ``gateway-helm`` from ``GSHARE_ATTACH_ENVOY_GATEWAY_REPO`` at
        ``GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION``.
    """
    version = settings.GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION
    values = {"config": {"envoyGateway": {
        "gateway": {"controllerName": ENVOY_GATEWAY_CONTROLLER},
        "provider": {"type": "Kubernetes"},
        "extensionApis": {"enableBackend": True},
        "envoyProxy": envoy_proxy_defaults(ingress_node),
    }}}
    return ChartRelease(release=ENVOY_GATEWAY_RELEASE, namespace=ENVOY_GATEWAY_NAMESPACE, chart="gateway-helm",
                        repo_url=settings.GSHARE_ATTACH_ENVOY_GATEWAY_REPO, version=version, values=values,
                        what=f"Envoy Gateway {version} on {ingress_node}")


@dataclass(frozen=True)
class StoragePlan:
    """What ``--storage-values`` (democratic-csi Helm values) says about the NFS pool.

    Attributes:
        storage_class: the first StorageClass the values create (the operator's volume StorageClass).
        server: the NFS server (``driver.config.nfs.shareHost``).
        nfs_version: 3 or 4 (``nfsvers=`` in the StorageClass mount options; 4 when absent).
        ports: TCP ports every node must reach on ``server``: 2049, plus 111 and 20048 for NFSv3.
        release: the democratic-csi release, values merged with ``csiDriver.storageCapacity: true``.
    """

    storage_class: str
    server: str
    nfs_version: int
    ports: tuple[int, ...]
    release: ChartRelease


def deep_merge(base: dict, extra: dict) -> dict:
    """Merge ``extra`` into a copy of ``base`` as Helm merges values: mappings merge key by key, anything else replaces.

    Returns:
        A new dict; neither argument is changed.
    """
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
                   r"|^\d{1,3}(\.\d{1,3}){3}$|^[0-9A-Fa-f:]+$")


def storage_plan(values: Any, path: str = "--storage-values") -> StoragePlan:
    """Read democratic-csi NFS values (the chart's ``examples/*-nfs.yaml`` layout) into a :class:`StoragePlan`.

    Args:
        values: the parsed values file (a mapping).
        path: the file name, for messages.

    Returns:
        The plan; ``release`` installs chart ``democratic-csi`` as ``gshare-storage`` in namespace ``gshare-storage``.

    Raises:
        AttachInputError: not a mapping, no ``storageClasses[0].name``, or no usable
            ``driver.config.nfs.shareHost``. Messages never quote a value of the file other than those two.
    """
    if not isinstance(values, dict):
        raise AttachInputError(f"{path} is not a YAML mapping of democratic-csi Helm values.")
    classes = values.get("storageClasses")
    if not isinstance(classes, list) or not classes or not isinstance(classes[0], dict) or not classes[0].get("name"):
        raise AttachInputError(f"{path} defines no StorageClass: add `storageClasses: [{{name: gshare-nfs, ...}}]` "
                               "(see democratic-csi's examples/zfs-generic-nfs.yaml).")
    storage_class = str(classes[0]["name"])
    nfs = ((values.get("driver") or {}).get("config") or {}).get("nfs") if isinstance(values.get("driver"), dict) else None
    server = str((nfs or {}).get("shareHost") or "").strip() if isinstance(nfs, dict) else ""
    if not server or not _HOST.match(server):
        raise AttachInputError(f"{path} has no usable NFS server in driver.config.nfs.shareHost (got {server!r}): "
                               "set it to the storage server's address as the nodes reach it.")
    options = [str(o) for o in (classes[0].get("mountOptions") or [])]
    nfs_version = 3 if any(o.replace(" ", "") in ("nfsvers=3", "vers=3") for o in options) else 4
    ports = (2049, 111, 20048) if nfs_version == 3 else (2049,)
    merged = deep_merge(values, {"csiDriver": {"storageCapacity": True}})
    version = settings.GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION
    release = ChartRelease(release=STORAGE_RELEASE, namespace=STORAGE_NAMESPACE, chart="democratic-csi",
                           repo_url=settings.GSHARE_ATTACH_DEMOCRATIC_CSI_REPO, version=version, values=merged,
                           secret_values=True, what=f"democratic-csi {version} (StorageClass {storage_class})")
    return StoragePlan(storage_class=storage_class, server=server, nfs_version=nfs_version, ports=ports, release=release)


# Docker/OCI reference grammar (distribution/reference): [host[:port]/]path-component(/path-component)*[:tag]
_IMAGE = re.compile(
    r"^(?:(?P<host>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::\d+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?$"
)


def split_image(image: str) -> dict[str, str]:
    """Split ``--operator-image`` into the chart's ``image.repository`` and ``image.tag``.

    Args:
        image: ``[registry[:port]/]repository[:tag]`` (no tag: ``latest``), the Docker reference grammar.

    Returns:
        ``{"repository": ..., "tag": ...}``.

    Raises:
        AttachInputError: not a valid reference (whitespace, upper-case repository, bad tag), or a digest reference.
    """
    image = image.strip()
    if "@" in image:
        raise AttachInputError(f"--operator-image {image!r} names a digest: give a tag instead (repository:tag).")
    match = _IMAGE.match(image)
    if not image or not match:
        raise AttachInputError(f"--operator-image {image!r} is not an image reference such as ghcr.io/gshare/gshare:0.2.0.")
    host = match.group("host")
    repository = f"{host}/{match.group('path')}" if host else match.group("path")
    return {"repository": repository, "tag": match.group("tag") or "latest"}


def operator_release(*, cluster_id: str, control_plane_url: str, image: str | None, storage_class: str) -> ChartRelease:
    """The gShare operator from this checkout's ``charts/gshare-operator`` into ``gshare-system``.

    Args:
        cluster_id: the cluster's ``clu_...`` id.
        control_plane_url: URL the operator's pod reaches the control plane at.
        image: ``--operator-image`` or None for the chart's default.
        storage_class: the volume StorageClass ("" when no storage was set up).
    """
    values: dict[str, Any] = {"clusterId": cluster_id, "controlPlaneUrl": control_plane_url,
                              "volumeStorageClass": storage_class, "tokenSecretName": settings.GSHARE_OPERATOR_TOKEN_SECRET}
    if image:
        values["image"] = split_image(image)
    return ChartRelease(release=OPERATOR_RELEASE, namespace=operator_namespace(), chart=str(OPERATOR_CHART),
                        repo_url="", version="", values=values, what="gShare operator")
