"""What a demo cluster in ``gateway-api`` routing mode holds besides the rest of the fleet (``demo.fleet``): Envoy
Gateway as its chart installs it and the Gateway gShare's session HTTPRoutes attach to.

* the Gateway API v1.6.1 and Envoy Gateway v1.9.0 CRDs, unchanged, as the Envoy Gateway chart installs them (the
  ``crds/`` of its stand-in ``demo/data/charts/gateway-helm``, provenance in ``demo/data/README.md``);
* the namespace ``envoy-gateway-system`` and the Deployment ``envoy-gateway`` (name, namespace and labels as the
  ``gateway-helm`` v1.9.0 chart renders them for the release ``eg``): what the emulator's Envoy Gateway stand-in
  controller waits for before it accepts GatewayClasses and programs Gateways;
* HAND: the GatewayClass ``envoy-gateway`` (``controllerName: gateway.envoyproxy.io/gatewayclass-controller``) and
  the Gateway ``contract.GATEWAY_NAME_DEFAULT`` in ``GATEWAY_NAMESPACE_DEFAULT``, with one ``HTTP``
  listener on port 80 for the cluster's session domain that admits routes from every namespace (the sessions'
  HTTPRoutes live in ``gshare-sessions``).

No Django here (``demo.fleet``'s rule).
"""

from __future__ import annotations

import copy
import functools
import pathlib
import uuid
from typing import Any

import yaml

from contract import GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT

CRD_DIR = pathlib.Path(__file__).resolve().parent / "data" / "charts" / "gateway-helm" / "crds"
"""The upstream CRDs the Envoy Gateway chart installs (its stand-in's ``crds/``, the files unchanged)."""

ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"
ENVOY_GATEWAY_DEPLOYMENT = "envoy-gateway"
ENVOY_GATEWAY_VERSION = "v1.9.0"
GATEWAY_CLASS = "envoy-gateway"
GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
"""Envoy Gateway's controller name (``spec.controllerName`` of the GatewayClasses it reconciles)."""

_UID_NAMESPACE = uuid.UUID("0b5a3d1e-7c1f-4f7a-9f55-2f1f5d1c9e42")  # HAND: fixed so uids are stable across runs


def _uid(cluster: str, kind: str, name: str, namespace: str = "") -> str:
    return str(uuid.uuid5(_UID_NAMESPACE, f"{cluster}/{kind}/{namespace}/{name}"))


@functools.cache
def _read_crds() -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: these files are 23,000 lines
    return tuple(yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 -- a safe loader
                 for path in sorted(CRD_DIR.glob("*.yaml")))


def gateway_crds(cluster: str) -> list[dict[str, Any]]:
    """The CRDs of ``CRD_DIR`` (sorted by file name; read once), fresh copies with a stable uid added."""
    crds = copy.deepcopy(list(_read_crds()))
    for crd in crds:
        crd["metadata"]["uid"] = _uid(cluster, "CustomResourceDefinition", crd["metadata"]["name"])
    return crds


def envoy_gateway_deployment(cluster: str) -> list[dict[str, Any]]:
    """The namespace ``envoy-gateway-system`` and the Deployment ``envoy-gateway`` (available, one replica)."""
    labels = {"control-plane": "envoy-gateway", "app.kubernetes.io/name": "gateway-helm",
              "app.kubernetes.io/instance": "eg"}
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": ENVOY_GATEWAY_NAMESPACE, "uid": _uid(cluster, "Namespace", ENVOY_GATEWAY_NAMESPACE),
                              "labels": {"kubernetes.io/metadata.name": ENVOY_GATEWAY_NAMESPACE}},
                 "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": ENVOY_GATEWAY_DEPLOYMENT, "namespace": ENVOY_GATEWAY_NAMESPACE,
                     "uid": _uid(cluster, "Deployment", ENVOY_GATEWAY_DEPLOYMENT, ENVOY_GATEWAY_NAMESPACE),
                     "labels": {**labels, "helm.sh/chart": f"gateway-helm-{ENVOY_GATEWAY_VERSION}",
                                "app.kubernetes.io/version": ENVOY_GATEWAY_VERSION,
                                "app.kubernetes.io/managed-by": "Helm"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "serviceAccountName": "envoy-gateway",
                     "containers": [{"name": "envoy-gateway",
                                     "image": f"docker.io/envoyproxy/gateway:{ENVOY_GATEWAY_VERSION}",
                                     "args": ["server", "--config-path=/config/envoy-gateway.yaml"]}]}}},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                   "availableReplicas": 1},
    }
    return [namespace, deployment]


def session_gateway(cluster: str, session_domain: str) -> list[dict[str, Any]]:
    """The GatewayClass and the Gateway the cluster's session HTTPRoutes attach to (see the module docstring)."""
    gateway_class = {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": GATEWAY_CLASS, "uid": _uid(cluster, "GatewayClass", GATEWAY_CLASS)},
        "spec": {"controllerName": GATEWAY_CONTROLLER},
    }
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": GATEWAY_NAME_DEFAULT, "namespace": GATEWAY_NAMESPACE_DEFAULT,
                     "uid": _uid(cluster, "Gateway", GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT)},
        "spec": {"gatewayClassName": GATEWAY_CLASS,
                 "listeners": [{"name": "http", "protocol": "HTTP", "port": 80, "hostname": session_domain,
                                "allowedRoutes": {"namespaces": {"from": "All"}}}]},
    }
    return [gateway_class, gateway]


def gateway_objects(cluster: str, session_domain: str) -> list[dict[str, Any]]:
    """Everything a ``gateway-api`` cluster holds for routing: CRDs, Envoy Gateway, GatewayClass and Gateway."""
    return [*gateway_crds(cluster), *envoy_gateway_deployment(cluster), *session_gateway(cluster, session_domain)]
