"""Render the Helm charts under ``charts/`` with the real Helm engine (helm-python-sdk) and read the output.

No cluster and no database: ``helm.Chart.render`` runs Helm's template engine offline, and every test here
reads only the rendered objects (and, for container commands, the project's own modules).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from attach.releases import deep_merge

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "charts"
CONTROL_PLANE_CHART = CHARTS / "gshare"
OPERATOR_CHART = CHARTS / "gshare-operator"

#: Kubernetes versions every rendered object is validated against (kubernetes-validate, strict schemas).
KUBERNETES_VERSIONS = ("1.31", "1.34")

RELEASE = "gshare"
NAMESPACE = "gshare"
OPERATOR_RELEASE = "gshare-operator"
OPERATOR_NAMESPACE = "gshare-system"

#: The smallest values the control-plane chart installs with: every REQUIRED value set. Without the internal
#: plane the clusters cannot use the public host (/internal answers 404 there), so they reach the api Service.
CONTROL_PLANE_VALUES: dict[str, Any] = {
    "controlPlaneUrl": "http://gshare-api.gshare.svc",
    "ingress": {"host": "gshare.example.com"},
    "database": {"existingSecret": "gshare-database"},
    "redis": {"existingSecret": "gshare-redis"},
    "django": {"existingSecret": "gshare-django"},
    "encryption": {"existingSecret": "gshare-encryption"},
}

#: Every optional feature of the control-plane chart switched on, with non-default names everywhere.
CONTROL_PLANE_FULL_VALUES: dict[str, Any] = {
    "controlPlaneUrl": "https://gshare-internal.example.com:8443/",
    "image": {"repository": "registry.example.com/gshare/gshare", "tag": "9.9.9", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry-pull"}],
    "database": {"existingSecret": "pg-app", "secretKey": "uri", "connMaxAge": 0},
    "redis": {"existingSecret": "redis-auth", "secretKey": "url"},
    "django": {
        "existingSecret": "django", "secretKey": "key",
        "allowedHosts": ["gshare.svc.example.com"], "csrfTrustedOrigins": ["https://console.example.com"],
    },
    "encryption": {"existingSecret": "fernet", "secretKey": "keys"},
    "signingKey": {"existingSecret": "jwt-signing", "secretKey": "tls.key"},
    "sessionNamespace": "gpu-sessions",
    "logLevel": "DEBUG",
    "settings": {"GSHARE_PLACEMENT_POLICY": "spread", "GSHARE_HEARTBEAT_STALE_SECONDS": 180},
    "extraEnv": [{"name": "GSHARE_JWT_ISSUER", "valueFrom": {"secretKeyRef": {"name": "issuer", "key": "iss"}}}],
    "api": {"replicas": 4, "workers": 5},
    "worker": {"replicas": 3, "concurrency": 8},
    "ingress": {
        "host": "gshare.example.com",
        "tlsSecretName": "gshare-tls",
        "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
        "internalPlane": {
            "enabled": True,
            "host": "gshare-internal.example.com",
            "className": "nginx-internal",
            "sourceRange": "203.0.113.0/24,198.51.100.7/32",
            "tlsSecretName": "gshare-internal-tls",
        },
    },
    "serviceAccount": {"create": False, "name": "gshare-workload"},
    "podAnnotations": {"example.com/team": "gpu"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "control-plane", "effect": "NoSchedule"}],
}

OPERATOR_VALUES: dict[str, Any] = {"clusterId": "clu_x7k2abcd3efgh4ij", "controlPlaneUrl": "https://gshare.example.com"}


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base`` (dicts merge, everything else replaces), as Helm does."""
    return deep_merge(base, override)


def without(values: dict[str, Any], dotted: str) -> dict[str, Any]:
    """A copy of ``values`` with the key at ``dotted`` (``a.b.c``) removed."""
    out = copy.deepcopy(values)
    *parents, leaf = dotted.split(".")
    node = out
    for part in parents:
        node = node[part]
    node.pop(leaf)
    return out


def render(chart: Path, values: dict[str, Any], *, name: str, namespace: str) -> list[dict[str, Any]]:
    """Render ``chart`` with ``values`` and return every Kubernetes object of the output (NOTES.txt left out).

    Each object gets the template it came from under the key ``__template__`` (removed before validation).
    """
    with helm.Chart.load(chart) as loaded:
        manifests = loaded.render(values, name=name, namespace=namespace, is_install=True)
    objects = []
    for template, text in sorted(manifests.items()):
        if not template.endswith((".yaml", ".yml")):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                document["__template__"] = template
                objects.append(document)
    return objects


def render_control_plane(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render charts/gshare as release ``gshare`` in namespace ``gshare``."""
    return render(CONTROL_PLANE_CHART, CONTROL_PLANE_VALUES if values is None else values, name=RELEASE, namespace=NAMESPACE)


def render_operator(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render charts/gshare-operator as release ``gshare-operator`` in namespace ``gshare-system``."""
    return render(OPERATOR_CHART, OPERATOR_VALUES if values is None else values, name=OPERATOR_RELEASE, namespace=OPERATOR_NAMESPACE)


def chart_crds(chart: Path) -> list[dict[str, Any]]:
    """The objects under the chart's ``crds/`` folder (Helm installs them, never renders them)."""
    with helm.Chart.load(chart) as loaded:
        return [doc for crd in loaded.crds for doc in yaml.safe_load_all(crd["data"]) if doc]


def chart_metadata(chart: Path) -> dict[str, Any]:
    """``Chart.yaml`` as Helm reads it."""
    with helm.Chart.load(chart) as loaded:
        return loaded.metadata


def chart_defaults(chart: Path) -> dict[str, Any]:
    """The chart's default values (``values.yaml``)."""
    with helm.Chart.load(chart) as loaded:
        return loaded.values


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The only object of ``kind`` (and ``name``, if given); fails the test when there are none or several."""
    found = [obj for obj in of_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(workload, pod spec)`` of every Deployment, Job, StatefulSet and DaemonSet."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield obj, obj["spec"]["template"]["spec"]


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(workload, container)`` of every container and init container of every workload."""
    for workload, spec in pod_specs(objects):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            yield workload, container


#: The api pod's nginx in front of gunicorn (``gshare.front_proxy``): it gets no settings and no Secret, by design.
PROXY_CONTAINER = "proxy"


def application_containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(workload, container)`` of every container running the project's code: all but the api pod's proxy."""
    for found in containers(objects):
        if found[1]["name"] != PROXY_CONTAINER:
            yield found


def workload(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The workload labelled ``app.kubernetes.io/component: <component>``."""
    found = [w for w, _ in pod_specs(objects) if w["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one workload of component {component}, found {len(found)}"
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's environment entries by name (names are unique: the test of that is separate)."""
    return {entry["name"]: entry for entry in container.get("env", [])}


def expect_render_error(render_fn, values: dict[str, Any]) -> str:
    """Render and return Helm's error message; fails the test when rendering succeeds."""
    with pytest.raises(helm.HelmRenderError) as caught:
        render_fn(values)
    return str(caught.value)
