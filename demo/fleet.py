"""The demo fleet: two emulated data-plane clusters built from real, copied fixtures.

* ``lab-c1`` - kubeadm v1.32.3, HAMi chart 2.10.0. GPU nodes: ``gpu-h100-01`` (8x NVIDIA H100 80GB HBM3,
  hami-core) and ``gpu-v100-01`` (2x Tesla V100-PCIE-32GB, hami-core), both with the v2.10 JSON register
  annotation.
* ``lab-c2`` - k3s v1.34.1+k3s1, HAMi chart 2.7.1 (legacy strings). GPU nodes: ``gpu-t4-01`` (1x Tesla T4,
  hami-core) still carrying the 7-field v2.4 annotation (its plugin pod is not rolled yet: the DaemonSet
  reports 1 of 2 updated) and ``gpu-h20-01`` (8x NVIDIA H20-3e, mig) with the 9-field v2.5-v2.7 one.

lab-c2 is in ``gateway-api`` routing mode by default (``GATEWAY_CLUSTER_DEFAULT``; Envoy Gateway, its CRDs and the
session Gateway, ``demo.fleet_gateway_api``), lab-c1 in ``ingress-nginx`` mode.

Each cluster also has one control-plane node without ``gpu=on``, the namespaces ``default``, ``kube-system``,
``gshare-system``, ``gshare-sessions`` (where the control plane applies ``GShareSession`` objects) and
``democratic-csi``, the ``GShareSession`` CustomResourceDefinition (``charts/gshare-operator/crds/gsharesessions.gshare.io.yaml``,
the file the operator chart installs), the RuntimeClass ``nvidia``, HAMi's device-plugin DaemonSet
``kube-system/hami-device-plugin`` and the shared NFS pool as democratic-csi presents it (``storage_objects``): the
CSIDriver ``org.democratic-csi.nfs``, the StorageClass ``gshare-nfs`` (``STORAGE_CLASS``) and CSIStorageCapacity
objects for it. Both clusters mount the same storage server, so their capacity objects describe the same pool: lab-c1
publishes two topology segments with different readings (``1643124Mi`` and ``1642872Mi``: the largest counts, never
the sum), lab-c2 one (``1643124Mi``).

Why H100+V100 / T4+H20 (and not H100+H20 / T4+V100): the HAMi v2.8+ scheduler reads only the JSON register
annotation and the <=v2.7 scheduler only the legacy string (``demo/data/README.md``), so a cluster mixing a
JSON node and a legacy node would have one GPU node its own HAMi cannot see. Grouped this way each cluster
runs one HAMi release that reads all of its nodes, and the two clusters still differ in GPU models, HAMi
version, annotation format, GPU mode (lab-c2 has a MIG node) and Kubernetes distribution.

Every value comes from a file in ``demo/data/`` (provenance in ``demo/data/README.md``), except those marked
HAND below (node CPU/memory of the nodes the template does not describe, IPs, names, control-plane nodes,
the DaemonSet's pod spec, which follows the HAMi chart template ``charts/hami/templates/device-plugin/
daemonsetnvidia.yaml`` rendered with release name ``hami`` in ``kube-system``). Node objects are modelled on
``k8s-objects/node.gpu-8xh100.hami-v2.10.json``; GPU-feature-discovery labels come from the nvidia-smi
captures where one matches the model (H100: ``--query-gpu`` CSV; T4: ``-q -x`` XML) and otherwise from the
HAMi annotation itself (model name and memory only).

This module must not import Django (``python -m demo.emulator`` and the tests use it without settings); it
reads only ``demo/data`` and the operator chart's CRD (never ``../shared`` nor ``tests/``).
"""

from __future__ import annotations

import copy
import csv
import json
import pathlib
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

import yaml

from contract import (
    HAMI_MONITOR_PORT_DEFAULT,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
    SESSION_NAMESPACE_DEFAULT,
)
from contract.quantity import quantity_decimal
from demo.fleet_gateway_api import gateway_objects
from operator_agent.hami import decode_node_register
from operator_agent.reporters.inventory import device_to_snapshot

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"
"""Directory of the copied fixtures (``hami/``, ``nvidia-smi/``, ``k8s-objects/``)."""

GPU_NODE_LABELS = {"gpu": "on"}
"""Label every GPU node carries (same key/value as ``contract.GPU_NODE_LABEL_KEY``/``_VALUE``)."""

GPU_MODE_LABEL = "gshare.io/gpu-mode"
"""Node label with the GPU sharing mode (``hami-core`` or ``mig``); same value as ``contract``."""

HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
HAMI_HANDSHAKE_ANNOTATION = "hami.io/node-handshake"
NODE_TEMPLATE = "k8s-objects/node.gpu-8xh100.hami-v2.10.json"
SESSION_CRD_FILE = DATA_DIR.parent.parent / "charts/gshare-operator/crds/gsharesessions.gshare.io.yaml"
"""The GShareSession CRD as the operator chart installs it (Helm ``crds/``), seeded into every demo cluster."""

STORAGE_CLASS = "gshare-nfs"
"""StorageClass of the shared NFS pool on every demo cluster (the operator's ``GSHARE_VOLUME_STORAGE_CLASS``)."""

CSI_DRIVER = "org.democratic-csi.nfs"
"""democratic-csi's NFS driver name (``csiDriver.name`` of its NFS examples): the StorageClass's provisioner."""

STORAGE_NAMESPACE = "democratic-csi"
"""Namespace of the democratic-csi release ``gshare-nfs`` (as ``attach_cluster`` installs it)."""

STORAGE_RELEASE = "gshare-nfs"
"""democratic-csi's Helm release name (``attach_cluster``'s); its controller Deployment owns the capacity objects."""

CSI_CAPACITY_TEMPLATE = "k8s-objects/csistoragecapacity.proxmox.real.yaml"
"""The real CSIStorageCapacity every demo capacity object is modelled on."""

DEMO_POD_STARTUP_SECONDS = 1.0
"""Seconds between a Pod's binding and ``Running`` in the demo's emulators (``podStartupSeconds`` of the seed)."""
_UID_NAMESPACE = uuid.UUID("6f1c3f0e-5b9a-4d51-9d0e-6b2f4f3b9a10")  # HAND: fixed so uids are stable across runs


# --------------------------------------------------------------------------- fixture readers


@dataclass(frozen=True)
class GpuFacts:
    """What a GPU model looks like to GPU feature discovery.

    Attributes:
        product_name: NVML name, e.g. ``NVIDIA H100 80GB HBM3``, ``Tesla T4``.
        memory_mib: total framebuffer memory, MiB.
        driver_version: e.g. ``590.48.01`` (None when unknown).
        cuda_version: CUDA runtime version reported by the driver, e.g. ``11.7`` (None when unknown).
        compute_capability: e.g. ``9.0`` (None when unknown).
        architecture: e.g. ``Turing`` (None when unknown).
        mig_capable: whether MIG mode is supported (None when unknown).
        source: the ``demo/data`` file the facts were read from.
    """

    product_name: str
    memory_mib: int
    driver_version: str | None = None
    cuda_version: str | None = None
    compute_capability: str | None = None
    architecture: str | None = None
    mig_capable: bool | None = None
    source: str = ""


def read_nvidia_smi_xml(path: str | pathlib.Path) -> GpuFacts:
    """Read the first GPU of an ``nvidia-smi -q -x`` capture.

    Args:
        path: the XML file (DTD v11-v13; values carry units, e.g. ``<total>15360 MiB</total>``).

    Returns:
        ``GpuFacts`` with product name, memory (MiB, from ``fb_memory_usage/total``), driver and CUDA
        versions, architecture and MIG capability (``current_mig`` other than ``N/A``).
    """
    root = ET.parse(path).getroot()
    gpu = root.find("gpu")
    if gpu is None:
        raise ValueError(f"{path}: no <gpu> element")
    mig = (gpu.findtext("mig_mode/current_mig") or "N/A").strip()
    return GpuFacts(
        product_name=(gpu.findtext("product_name") or "").strip(),
        memory_mib=int((gpu.findtext("fb_memory_usage/total") or "0").split()[0]),
        driver_version=(root.findtext("driver_version") or "").strip() or None,
        cuda_version=(root.findtext("cuda_version") or "").strip() or None,
        architecture=(gpu.findtext("product_architecture") or "").strip() or None,
        mig_capable=mig != "N/A",
        source=str(pathlib.Path(path).relative_to(DATA_DIR)) if _under_data(path) else str(path),
    )


def read_nvidia_smi_csv(path: str | pathlib.Path) -> GpuFacts:
    """Read the first GPU row of an ``nvidia-smi --query-gpu=... --format=csv`` capture.

    Args:
        path: the CSV file (header row with units such as ``memory.total [MiB]``, values such as ``81559 MiB``,
            fields separated by ``", "``, unavailable values ``[N/A]``).

    Returns:
        ``GpuFacts`` with product name (``name``), memory (MiB, ``memory.total``), driver version,
        compute capability (``compute_cap``) and MIG capability (``mig.mode.current`` not ``[N/A]``).
    """
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, skipinitialspace=True))
    header, values = rows[0], rows[1]
    fields = {name.split(" [")[0].strip(): value.strip() for name, value in zip(header, values, strict=True)}

    def known(key: str) -> str | None:
        value = fields.get(key)
        return None if value is None or value.startswith("[") else value

    return GpuFacts(
        product_name=fields["name"],
        memory_mib=int(fields["memory.total"].split()[0]),
        driver_version=known("driver_version"),
        compute_capability=known("compute_cap"),
        mig_capable=known("mig.mode.current") is not None,
        source=str(pathlib.Path(path).relative_to(DATA_DIR)) if _under_data(path) else str(path),
    )


def _under_data(path: str | pathlib.Path) -> bool:
    return pathlib.Path(path).resolve().is_relative_to(DATA_DIR)


def decode_hami_register(value: str) -> list[dict[str, Any]]:
    """Decode a HAMi node-register annotation with the operator's own decoder (``operator_agent.hami``).

    Args:
        value: the raw annotation value (JSON from HAMi v2.8, legacy 5/6/7/9-field strings before).

    Returns:
        One snapshot dict per GPU (``operator_agent.reporters.inventory.device_to_snapshot``), sorted by ``(index, uuid)``.

    Raises:
        operator_agent.hami.HamiDecodeError: the value is malformed.
    """
    devices = [device_to_snapshot(device) for device in decode_node_register(value)]
    return sorted(devices, key=lambda d: (d["index"], d["uuid"]))


def _handshake_value(found_in: str) -> str:
    """A ``hami.io/node-handshake`` value from ``hami/node-handshake.observed-values.yaml`` by its source."""
    items = yaml.safe_load((DATA_DIR / "hami/node-handshake.observed-values.yaml").read_text(encoding="utf-8"))
    for item in items:
        if item["key"] == HAMI_HANDSHAKE_ANNOTATION and found_in in item["found_in"]:
            return item["value"]
    raise LookupError(f"no handshake value found in {found_in!r}")


# --------------------------------------------------------------------------- fleet description


@dataclass(frozen=True)
class NodeSpec:
    """One node of a demo cluster.

    Attributes:
        name: node name (also ``kubernetes.io/hostname``).
        internal_ip: ``InternalIP`` address (HAND, 10.0.0.x placeholders as in the fixtures).
        cpu: CPU capacity (cores, as a quantity string).
        memory: memory capacity (quantity string, e.g. ``2113442580Ki``).
        hami_file: register annotation fixture under ``demo/data`` (None: not a GPU node).
        hami_version: HAMi release whose device plugin wrote the annotation, e.g. ``v2.10.0``.
        gpu_mode: value of ``gshare.io/gpu-mode`` (``hami-core`` or ``mig``).
        nvidia_smi_file: nvidia-smi capture under ``demo/data`` for GFD labels (None: from the annotation).
        gpu_memory_mib: physical GPU memory when it differs from the annotation's (scaled) ``devmem``.
        handshake: value of ``hami.io/node-handshake``, or None.
    """

    name: str
    internal_ip: str
    cpu: str
    memory: str
    hami_file: str | None = None
    hami_version: str | None = None
    gpu_mode: str | None = None
    nvidia_smi_file: str | None = None
    gpu_memory_mib: int | None = None
    handshake: str | None = None

    @property
    def is_gpu_node(self) -> bool:
        """Whether the node carries ``gpu=on`` and a HAMi annotation."""
        return self.hami_file is not None

    def devices(self) -> list[dict[str, Any]]:
        """The GPUs of the node, decoded from its annotation fixture (see ``decode_hami_register``)."""
        return decode_hami_register(self.register_annotation()) if self.hami_file else []

    def register_annotation(self) -> str:
        """The raw ``hami.io/node-nvidia-register`` value, byte for byte from the fixture."""
        if self.hami_file is None:
            raise ValueError(f"{self.name} is not a GPU node")
        return (DATA_DIR / self.hami_file).read_text(encoding="utf-8")

    def gpu_facts(self) -> GpuFacts | None:
        """GFD facts: from the nvidia-smi capture when there is one, else model and memory from the annotation."""
        if not self.is_gpu_node:
            return None
        if self.nvidia_smi_file is not None:
            path = DATA_DIR / self.nvidia_smi_file
            return read_nvidia_smi_xml(path) if path.suffix == ".xml" else read_nvidia_smi_csv(path)
        first = self.devices()[0]
        return GpuFacts(product_name=first["model"], memory_mib=self.gpu_memory_mib or first["memory_mib"],
                        source=str(self.hami_file))


@dataclass(frozen=True)
class ClusterSpec:
    """One emulated data-plane cluster.

    Attributes:
        name: cluster name (``lab-c1``, ``lab-c2``).
        distribution: ``kubeadm`` or ``k3s`` (node labels, annotations, kubelet version, pod CIDRs).
        version_file: ``/version`` fixture under ``demo/data``.
        hami_chart_version: HAMi Helm chart version (also appVersion and image tag ``v<version>``).
        nodes: the nodes, control plane first.
        description: one line for humans.
        ingress_node: the node that runs the cluster's ingress controller (the control-plane node; kubeadm's
            is left untainted, as its docs suggest for small clusters).
        storage_segments: ``(topology zone, capacity quantity)`` of each CSIStorageCapacity object the shared NFS
            pool's democratic-csi controller publishes on this cluster for ``STORAGE_CLASS``.
        routing: how sessions are reached by default (``gateway-api``: Envoy Gateway, ``demo.fleet_gateway_api``;
            ``ingress-nginx``); the demo's ``--gateway-cluster`` overrides it.
    """

    name: str
    distribution: str
    version_file: str
    hami_chart_version: str
    nodes: tuple[NodeSpec, ...]
    description: str
    ingress_node: str
    storage_segments: tuple[tuple[str, str], ...] = ()
    routing: str = ROUTING_INGRESS_NGINX

    @property
    def gpu_nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes labelled ``gpu=on``."""
        return tuple(n for n in self.nodes if n.is_gpu_node)


FLEET: list[ClusterSpec] = [
    ClusterSpec(
        name="lab-c1",
        distribution="kubeadm",
        version_file="k8s-objects/version.kubeadm-v1.32.3-arm64.json",
        hami_chart_version="2.10.0",
        description="kubeadm v1.32.3, HAMi 2.10.0: 8x H100 80GB HBM3 + 2x Tesla V100-PCIE-32GB (hami-core)",
        ingress_node="lab-c1-cp-01",
        # HAND: two topology segments of the shared pool, read a moment apart (252 MiB written in between).
        storage_segments=(("lab-c1-rack-1", "1643124Mi"), ("lab-c1-rack-2", "1642872Mi")),
        nodes=(
            NodeSpec(name="lab-c1-cp-01", internal_ip="10.0.0.10", cpu="8", memory="32859096Ki"),
            NodeSpec(
                name="gpu-h100-01", internal_ip="10.0.0.11", cpu="160", memory="2113442580Ki",
                hami_file="hami/node-nvidia-register.v2.10.json.h100x8.derived.json", hami_version="v2.10.0",
                gpu_mode="hami-core", nvidia_smi_file="nvidia-smi/h100-80gb-hbm3-mig.query-gpu.load.csv",
                handshake="Requesting_2026-09-01 10:34:13",  # the template node's value (v2.10 scheduler)
            ),
            NodeSpec(
                name="gpu-v100-01", internal_ip="10.0.0.12", cpu="32", memory="263856976Ki",
                hami_file="hami/node-nvidia-register.v2.10.json.v100x2.doc.json", hami_version="v2.10.0",
                gpu_mode="hami-core", handshake="Requesting_2026-09-01 10:34:13",
            ),
        ),
    ),
    ClusterSpec(
        name="lab-c2",
        distribution="k3s",
        version_file="k8s-objects/version.k3s-v1.34.1+k3s1.json",
        hami_chart_version="2.7.1",
        description="k3s v1.34.1+k3s1, HAMi 2.7.1: 1x Tesla T4 (hami-core) + 8x NVIDIA H20-3e (mig)",
        ingress_node="lab-c2-server-01",
        storage_segments=(("lab-c2-rack-1", "1643124Mi"),),
        routing=ROUTING_GATEWAY_API,
        nodes=(
            NodeSpec(name="lab-c2-server-01", internal_ip="10.0.0.20", cpu="4", memory="16310120Ki"),
            NodeSpec(
                name="gpu-t4-01", internal_ip="10.0.0.21", cpu="8", memory="32329092Ki",
                hami_file="hami/node-nvidia-register.v2.4.legacy7.t4x1.txt", hami_version="v2.4.1",
                gpu_mode="hami-core", nvidia_smi_file="nvidia-smi/tesla-t4.q-x.xml",
                handshake=_handshake_value("issue #602"),
            ),
            NodeSpec(
                name="gpu-h20-01", internal_ip="10.0.0.22", cpu="160", memory="2113442580Ki",
                hami_file="hami/node-nvidia-register.v2.5-v2.7.legacy9.h20x8-mig-scaled.txt", hami_version="v2.7.1",
                gpu_mode="mig", gpu_memory_mib=143771,  # physical H20-3e memory (devmem is x1.8 scaled), README
                handshake=_handshake_value("issue #961"),
            ),
        ),
    ),
]
"""The demo fleet (see the module docstring)."""

GATEWAY_CLUSTER_DEFAULT = next((spec.name for spec in FLEET if spec.routing == ROUTING_GATEWAY_API), None)
"""The cluster in ``gateway-api`` routing mode unless the demo is told otherwise (lab-c2); the others use ingress-nginx."""


def session_domain(name: str) -> str:
    """The session domain of a demo cluster: ``<name>.gshare.localhost`` (browsers resolve it to loopback)."""
    return f"{name}.gshare.localhost"


def cluster_spec(name: str) -> ClusterSpec:
    """The ``ClusterSpec`` named ``name``.

    Raises:
        KeyError: no such cluster in ``FLEET``.
    """
    for spec in FLEET:
        if spec.name == name:
            return spec
    raise KeyError(f"no demo cluster {name!r}; known: {', '.join(s.name for s in FLEET)}")


# --------------------------------------------------------------------------- objects


def cluster_version(name: str) -> dict[str, str]:
    """The ``/version`` document of a demo cluster (the copied fixture, unchanged)."""
    return json.loads((DATA_DIR / cluster_spec(name).version_file).read_text(encoding="utf-8"))


def _uid(cluster: str, kind: str, name: str, namespace: str = "") -> str:
    return str(uuid.uuid5(_UID_NAMESPACE, f"{cluster}/{kind}/{namespace}/{name}"))


def gfd_labels(facts: GpuFacts, count: int) -> dict[str, str]:
    """GPU-feature-discovery labels for a node (NVIDIA/k8s-device-plugin ``docs/gpu-feature-discovery``).

    Args:
        facts: the GPU model's facts.
        count: number of physical GPUs on the node.

    Returns:
        ``nvidia.com/*`` labels; only those the facts support (no driver/CUDA/compute labels when unknown).
    """
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.product": facts.product_name.replace(" ", "-"),
        "nvidia.com/gpu.memory": str(facts.memory_mib),
    }
    if facts.driver_version:
        major, minor, rev = (facts.driver_version.split(".") + ["", ""])[:3]
        labels.update({
            "nvidia.com/cuda.driver-version.full": facts.driver_version,
            "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor,
            "nvidia.com/cuda.driver-version.revision": rev,
            "nvidia.com/cuda.driver.major": major,
            "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": rev,
        })
    if facts.cuda_version:
        cmajor, cminor = (facts.cuda_version.split(".") + [""])[:2]
        labels.update({
            "nvidia.com/cuda.runtime-version.full": facts.cuda_version,
            "nvidia.com/cuda.runtime-version.major": cmajor,
            "nvidia.com/cuda.runtime-version.minor": cminor,
            "nvidia.com/cuda.runtime.major": cmajor,
            "nvidia.com/cuda.runtime.minor": cminor,
        })
    if facts.compute_capability:
        major, _, minor = facts.compute_capability.partition(".")
        labels["nvidia.com/gpu.compute.major"] = major
        labels["nvidia.com/gpu.compute.minor"] = minor or "0"
        family = {"9": "hopper", "8": "ampere", "7": "volta", "6": "pascal"}.get(major)
        if facts.compute_capability == "7.5":
            family = "turing"
        if family:
            labels["nvidia.com/gpu.family"] = family
    elif facts.architecture:
        labels["nvidia.com/gpu.family"] = facts.architecture.lower()
    if facts.mig_capable is not None:
        labels["nvidia.com/mig.capable"] = "true" if facts.mig_capable else "false"
    return labels


def node_object(cluster: ClusterSpec, node: NodeSpec, index: int) -> dict[str, Any]:
    """A ``v1/Node`` modelled on ``k8s-objects/node.gpu-8xh100.hami-v2.10.json``.

    Args:
        cluster: the node's cluster (distribution and version decide kubelet version, labels, annotations).
        node: the node.
        index: position in the cluster (pod CIDR ``10.244.<index>.0/24`` or ``10.42.<index>.0/24`` for k3s).

    Returns:
        The Node dict: labels ``kubernetes.io/*``, for GPU nodes ``gpu=on``, ``gshare.io/gpu-mode`` and GFD
        labels; annotation ``hami.io/node-nvidia-register`` (raw fixture value) and ``hami.io/node-handshake``;
        ``status.capacity``/``allocatable`` with ``nvidia.com/gpu`` = sum of the GPUs' split counts;
        conditions from the template (Ready=True).
    """
    template = json.loads((DATA_DIR / NODE_TEMPLATE).read_text(encoding="utf-8"))
    version = cluster_version(cluster.name)["gitVersion"]
    k3s = cluster.distribution == "k3s"
    labels = {k: v for k, v in template["metadata"]["labels"].items()
              if k.startswith(("beta.kubernetes.io/", "kubernetes.io/"))}
    labels["kubernetes.io/hostname"] = node.name
    annotations = {k: v for k, v in template["metadata"]["annotations"].items()
                   if not k.startswith("hami.io/") and not (k3s and k.startswith("kubeadm."))}
    if k3s:
        labels["node.kubernetes.io/instance-type"] = "k3s"
        annotations["k3s.io/hostname"] = node.name
        annotations["k3s.io/internal-ip"] = node.internal_ip
    status = copy.deepcopy(template["status"])
    capacity = {"cpu": node.cpu, "memory": node.memory}
    for key in ("ephemeral-storage", "hugepages-1Gi", "hugepages-2Mi", "pods"):
        capacity[key] = template["status"]["capacity"][key]
    allocatable = dict(capacity, **{"ephemeral-storage": template["status"]["allocatable"]["ephemeral-storage"]})
    if node.is_gpu_node:
        devices = node.devices()
        facts = node.gpu_facts()
        assert facts is not None
        labels.update(GPU_NODE_LABELS)
        labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
        labels[GPU_MODE_LABEL] = node.gpu_mode or "hami-core"
        labels.update(gfd_labels(facts, len(devices)))
        annotations[HAMI_REGISTER_ANNOTATION] = node.register_annotation()
        if node.handshake:
            annotations[HAMI_HANDSHAKE_ANNOTATION] = node.handshake
        vgpus = str(sum(d["split_count"] for d in devices))
        capacity["nvidia.com/gpu"] = vgpus
        allocatable["nvidia.com/gpu"] = vgpus
    else:
        labels["node-role.kubernetes.io/control-plane"] = "true" if k3s else ""
        if k3s:
            labels["node-role.kubernetes.io/master"] = "true"
    status["capacity"] = capacity
    status["allocatable"] = allocatable
    status["addresses"] = [{"type": "InternalIP", "address": node.internal_ip},
                           {"type": "Hostname", "address": node.name}]
    if node.name == cluster.ingress_node:
        # The demo's ingress (demo/ingress_nginx.py) listens on loopback, where its session domains (``*.localhost``)
        # resolve: the operator's session_domain_resolves check compares the two.
        status["addresses"].append({"type": "ExternalIP", "address": "127.0.0.1"})
    status["nodeInfo"].update({"kubeletVersion": version, "kubeProxyVersion": version})
    cidr = f"10.42.{index}.0/24" if k3s else f"10.244.{index}.0/24"
    spec: dict[str, Any] = {"podCIDR": cidr, "podCIDRs": [cidr]}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "uid": _uid(cluster.name, "Node", node.name),
            "creationTimestamp": template["metadata"]["creationTimestamp"],
            "labels": dict(sorted(labels.items())),
            "annotations": dict(sorted(annotations.items())),
        },
        "spec": spec,
        "status": status,
    }


def _namespace(cluster: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "uid": _uid(cluster, "Namespace", name),
                     "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def session_crd(cluster: str) -> dict[str, Any] | None:
    """The ``gsharesessions.gshare.io`` CustomResourceDefinition (``SESSION_CRD_FILE``, with a stable uid added).

    Returns:
        The CRD, or None while the chart does not ship the file (then the demo clusters serve no
        ``gshare.io`` resource and the operator cannot reconcile sessions).
    """
    if not SESSION_CRD_FILE.is_file():
        return None
    obj = yaml.safe_load(SESSION_CRD_FILE.read_text(encoding="utf-8"))
    obj["metadata"]["uid"] = _uid(cluster, "CustomResourceDefinition", obj["metadata"]["name"])
    return obj


def runtime_class(cluster: str) -> dict[str, Any]:
    """RuntimeClass ``nvidia`` (``k8s-objects/runtimeclass.nvidia.yaml``, with a stable uid added)."""
    obj = yaml.safe_load((DATA_DIR / "k8s-objects/runtimeclass.nvidia.yaml").read_text(encoding="utf-8"))
    obj["metadata"]["uid"] = _uid(cluster, "RuntimeClass", obj["metadata"]["name"])
    return obj


def hami_device_plugin_daemonset(cluster: ClusterSpec) -> dict[str, Any]:
    """HAMi's NVIDIA device-plugin DaemonSet as ``helm install hami hami-charts/hami -n kube-system`` creates it.

    Name, labels, selector and pod labels follow ``charts/hami/templates/device-plugin/daemonsetnvidia.yaml``
    and ``_helpers.tpl`` (release ``hami``: fullname ``hami``, ``app.kubernetes.io/component:
    hami-device-plugin``, ``app.kubernetes.io/name: hami``, ``app.kubernetes.io/instance: hami``,
    ``helm.sh/chart: hami-<version>``); node selector ``gpu: "on"`` (chart ``devicePlugin.nvidianodeSelector``);
    image ``docker.io/projecthami/hami:v<version>``; the ``vgpu-monitor`` container (HAMi's vGPU monitor) with the
    chart's ``ports: [{name: metrics, containerPort: 9394, protocol: TCP}]``. The status counts the cluster's GPU nodes; in lab-c2 one
    of them is not yet updated (its annotation is still the v2.4 one).
    """
    version = cluster.hami_chart_version
    selector = {"app.kubernetes.io/component": "hami-device-plugin", "app.kubernetes.io/name": "hami",
                "app.kubernetes.io/instance": "hami"}
    labels = {**selector, "helm.sh/chart": f"hami-{version}", "app.kubernetes.io/version": version,
              "app.kubernetes.io/managed-by": "Helm"}
    image = f"docker.io/projecthami/hami:v{version}"
    gpu_nodes = cluster.gpu_nodes
    updated = sum(1 for n in gpu_nodes if n.hami_version == f"v{version}")
    env_node = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "hami-device-plugin",
            "namespace": "kube-system",
            "uid": _uid(cluster.name, "DaemonSet", "hami-device-plugin", "kube-system"),
            "labels": labels,
            "annotations": {"deprecated.daemonset.template.generation": "1", "meta.helm.sh/release-name": "hami",
                            "meta.helm.sh/release-namespace": "kube-system"},
        },
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {
                "metadata": {"labels": {**selector, "hami.io/webhook": "ignore"}},
                "spec": {
                    "serviceAccountName": "hami-device-plugin",
                    "priorityClassName": "system-node-critical",
                    "hostPID": True,
                    "hostNetwork": True,
                    "nodeSelector": dict(GPU_NODE_LABELS),
                    "containers": [
                        {"name": "device-plugin", "image": image, "imagePullPolicy": "IfNotPresent",
                         "command": ["nvidia-device-plugin", "--config-file=/device-config.yaml",
                                     "--mig-strategy=none", "--disable-core-limit=false"],
                         "env": [env_node, {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"},
                                 {"name": "HOOK_PATH", "value": "/usr/local"}],
                         "securityContext": {"privileged": True, "allowPrivilegeEscalation": True,
                                             "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}},
                        {"name": "vgpu-monitor", "image": image, "imagePullPolicy": "IfNotPresent",
                         "command": ["vGPUmonitor"],
                         "env": [env_node, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                 {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"},
                                 {"name": "HOOK_PATH", "value": "/usr/local/vgpu"}],
                         "ports": [{"name": "metrics", "containerPort": HAMI_MONITOR_PORT_DEFAULT, "protocol": "TCP"}]},
                    ],
                },
            },
        },
        "status": {
            "currentNumberScheduled": len(gpu_nodes),
            "desiredNumberScheduled": len(gpu_nodes),
            "numberAvailable": len(gpu_nodes),
            "numberMisscheduled": 0,
            "numberReady": len(gpu_nodes),
            "observedGeneration": 1,
            "updatedNumberScheduled": updated,
        },
    }


def csi_storage_capacities(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The CSIStorageCapacity objects of the shared pool on a cluster, one per ``cluster.storage_segments`` entry.

    Built from ``CSI_CAPACITY_TEMPLATE`` (a real object): same shape, labels (driver name, ``external-provisioner``)
    and Deployment owner; name ``csisc-<5 stable characters>``, namespace ``democratic-csi``, driver
    ``org.democratic-csi.nfs``, owner ``gshare-nfs-democratic-csi-controller``, topology
    ``topology.kubernetes.io/region: lab`` + the segment's zone, ``storageClassName: gshare-nfs``, the segment's
    ``capacity``.
    """
    template = yaml.safe_load((DATA_DIR / CSI_CAPACITY_TEMPLATE).read_text(encoding="utf-8"))
    owner_name = f"{STORAGE_RELEASE}-democratic-csi-controller"
    objects = []
    for zone, capacity in cluster.storage_segments:
        obj = copy.deepcopy(template)
        uid = _uid(cluster.name, "CSIStorageCapacity", zone, STORAGE_NAMESPACE)
        # apiserver generateName alphabet (apimachinery storage/names): no vowels, no 0/1/3
        suffix = "".join(c for c in uid.replace("-", "") if c in "bcdfghjklmnpqrstvwxz2456789")[:5]
        meta = obj["metadata"]
        meta.pop("resourceVersion", None)
        meta.update({
            "name": f"{meta['generateName']}{suffix}",
            "namespace": STORAGE_NAMESPACE,
            "uid": uid,
            "labels": {"csi.storage.k8s.io/drivername": CSI_DRIVER,
                       "csi.storage.k8s.io/managed-by": "external-provisioner"},
        })
        meta["ownerReferences"][0].update(name=owner_name,
                                          uid=_uid(cluster.name, "Deployment", owner_name, STORAGE_NAMESPACE))
        obj["nodeTopology"] = {"matchLabels": {"topology.kubernetes.io/region": "lab",
                                               "topology.kubernetes.io/zone": zone}}
        obj["storageClassName"] = STORAGE_CLASS
        obj["capacity"] = capacity
        objects.append(obj)
    return objects


def storage_objects(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The shared NFS pool as democratic-csi presents it on a cluster (see the module docstring).

    Returns:
        The CSIDriver ``org.democratic-csi.nfs`` (``attachRequired: false``, ``podInfoOnMount: true``,
        ``storageCapacity: true`` as ``attach_cluster`` sets it), the StorageClass ``gshare-nfs`` (provisioner
        ``org.democratic-csi.nfs``, ``parameters.fsType: nfs``, ``Delete``, ``Immediate``, expandable, mount options
        ``noatime``/``nfsvers=4``; not the default class) and ``csi_storage_capacities(cluster)``.
    """
    helm = {"app.kubernetes.io/name": "democratic-csi", "app.kubernetes.io/instance": STORAGE_RELEASE,
            "app.kubernetes.io/managed-by": "Helm"}
    release = {"meta.helm.sh/release-name": STORAGE_RELEASE, "meta.helm.sh/release-namespace": STORAGE_NAMESPACE}
    driver = {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": CSI_DRIVER, "uid": _uid(cluster.name, "CSIDriver", CSI_DRIVER), "labels": dict(helm),
                     "annotations": dict(release)},
        "spec": {"attachRequired": False, "podInfoOnMount": True, "storageCapacity": True,
                 "volumeLifecycleModes": ["Persistent"]},
    }
    storage_class = {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "uid": _uid(cluster.name, "StorageClass", STORAGE_CLASS),
                     "labels": dict(helm),
                     "annotations": {**release, "storageclass.kubernetes.io/is-default-class": "false"}},
        "provisioner": CSI_DRIVER,
        "parameters": {"fsType": "nfs"},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": True,
        "mountOptions": ["noatime", "nfsvers=4"],
    }
    return [driver, storage_class, *csi_storage_capacities(cluster)]


def cluster_objects(name: str, *, with_session_crd: bool = True, routing: str | None = None) -> list[dict[str, Any]]:
    """Every object of a demo cluster, ready for ``EmulatedCluster(objects)`` or a seed file.

    Args:
        name: cluster name.
        with_session_crd: False leaves the ``GShareSession`` CRD out (a cluster the operator chart was not
            installed on yet).
        routing: ``gateway-api`` adds the Gateway API and Envoy Gateway CRDs, Envoy Gateway's Deployment, the
            GatewayClass and the session Gateway (``demo.fleet_gateway_api.gateway_objects``); None: the cluster's own
            ``ClusterSpec.routing``.

    Returns:
        Namespaces (``default``, ``kube-system``, ``gshare-system``, ``gshare-sessions``, ``democratic-csi``), the
        ``GShareSession`` CRD (``session_crd``, when the chart ships it), the nodes (control plane first), the
        RuntimeClass ``nvidia``, the DaemonSet ``kube-system/hami-device-plugin`` and the shared NFS pool
        (``storage_objects``); fresh dicts on every call.

    Raises:
        KeyError: no such cluster.
    """
    cluster = cluster_spec(name)
    namespaces = ("default", "kube-system", "gshare-system", SESSION_NAMESPACE_DEFAULT, STORAGE_NAMESPACE)
    objects: list[dict[str, Any]] = [_namespace(name, ns) for ns in namespaces]
    crd = session_crd(name) if with_session_crd else None
    if crd is not None:
        objects.append(crd)
    objects += [node_object(cluster, node, i) for i, node in enumerate(cluster.nodes)]
    objects.append(runtime_class(name))
    objects.append(hami_device_plugin_daemonset(cluster))
    objects += storage_objects(cluster)
    if (routing or cluster.routing) == ROUTING_GATEWAY_API:
        objects += gateway_objects(name, session_domain(name))
    return objects


def hami_monitor_scheme(name: str) -> str:
    """The metric names the cluster's HAMi vGPU monitor serves: ``current`` from HAMi 2.9.0 (lab-c1's 2.10.0),
    ``legacy`` before (lab-c2's 2.7.1; see ``demo.emulator.controllers.hami_metrics``).

    Raises:
        KeyError: no such cluster.
    """
    major, minor = (int(part) for part in cluster_spec(name).hami_chart_version.split(".")[:2])
    return "current" if (major, minor) >= (2, 9) else "legacy"


def write_seed(name: str, path: str | pathlib.Path,
               pod_startup_seconds: float | None = DEMO_POD_STARTUP_SECONDS, routing: str | None = None) -> pathlib.Path:
    """Write the seed file ``python -m demo.emulator --seed`` serves.

    Args:
        name: cluster name.
        path: output file.
        pod_startup_seconds: ``podStartupSeconds`` of the seed: the emulator schedules Pods with HAMi's rules and
            runs them that many seconds after binding (``demo.emulator.KubeApiEmulator``); None leaves Pods
            ``Pending`` (the key is then omitted).
        routing: the cluster's routing mode (``cluster_objects``), None: its own.

    Returns:
        The path written: JSON ``{"cluster": name, "version": {...}, "podStartupSeconds": 1.0,
        "hamiMonitorScheme": "current"|"legacy", "objects": [...]}`` (the monitor's metric names: ``hami_monitor_scheme``).
    """
    path = pathlib.Path(path)
    seed: dict[str, Any] = {"cluster": name, "version": cluster_version(name)}
    if pod_startup_seconds is not None:
        seed["podStartupSeconds"] = pod_startup_seconds
    seed["hamiMonitorScheme"] = hami_monitor_scheme(name)
    seed["objects"] = cluster_objects(name, routing=routing)
    path.write_text(json.dumps(seed, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return path


def expected_inventory(name: str) -> dict[str, Any]:
    """What the demo should end up knowing about a cluster once its operator has reported.

    Returns:
        ``{"cluster": name, "nodes": <GPU nodes (gpu=on)>, "gpus": <physical GPUs>, "vgpus": <sum of split
        counts = the nodes' nvidia.com/gpu>, "models": <sorted model names>, "kubernetes_version": <gitVersion>,
        "hami_chart_version": str, "snapshot": {"nodes": [...]}}`` where ``snapshot`` is the ``PUT inventory``
        body the operator should send (``operator_agent.reporters.inventory.collect_inventory``): nodes sorted by name,
        each ``{"name", "labels", "ready": True, "cpu_allocatable_millicores", "memory_allocatable_mib",
        "devices": [decode_hami_register(...)...]}``.
    """
    cluster = cluster_spec(name)
    nodes = []
    for i, node in enumerate(cluster.nodes):
        if node.is_gpu_node:
            obj = node_object(cluster, node, i)
            allocatable = obj["status"]["allocatable"]
            nodes.append({"name": node.name, "labels": obj["metadata"]["labels"], "ready": True,
                          # status.allocatable as the operator reports it: millicores and MiB, rounded down
                          "cpu_allocatable_millicores": int(quantity_decimal(allocatable["cpu"]) * 1000 // 1),
                          "memory_allocatable_mib": int(quantity_decimal(allocatable["memory"]) // 2**20),
                          "devices": node.devices()})
    nodes.sort(key=lambda n: n["name"])
    devices = [d for n in nodes for d in n["devices"]]
    return {
        "cluster": name,
        "nodes": len(nodes),
        "gpus": len(devices),
        "vgpus": sum(d["split_count"] for d in devices),
        "models": sorted({d["model"] for d in devices}),
        "kubernetes_version": cluster_version(name)["gitVersion"],
        "hami_chart_version": cluster.hami_chart_version,
        "snapshot": {"nodes": nodes},
    }


def fleet_gpu_uuids() -> list[str]:
    """Every GPU UUID of the fleet, in fleet order (must be unique: tests check it)."""
    return [d["uuid"] for c in FLEET for n in c.gpu_nodes for d in n.devices()]


# --------------------------------------------------------------------------- a cluster before attach_cluster

#: ``nvidia-ctk --version`` as NVIDIA Container Toolkit 1.17.8 prints it (first line; the second names the commit).
NVIDIA_CTK_VERSION_OUTPUT = "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d"


def nvidia_smi_list(node: NodeSpec) -> str:
    """``nvidia-smi -L`` for a GPU node: ``GPU <index>: <name> (UUID: <uuid>)`` per GPU, as in
    ``nvidia-smi/h100-80gb-hbm3-mig.list-L.txt`` (DERIVED from the node's HAMi annotation: index, model, UUID)."""
    lines = []
    for device in sorted(node.devices(), key=lambda d: d["index"]):
        model = device["model"].removeprefix("NVIDIA-") if device["model"].startswith("NVIDIA-NVIDIA") else device["model"]
        model = model.removeprefix("NVIDIA-") if model.startswith("NVIDIA-Tesla") else model
        lines.append(f"GPU {device['index']}: {model} (UUID: {device['uuid']})")
    return "\n".join(lines)


def bare_cluster_objects(name: str) -> list[dict[str, Any]]:
    """A demo cluster as it is before ``attach_cluster``: the nodes without gShare's labels, HAMi's annotations or
    ``nvidia.com/gpu`` resources, the namespaces ``default`` and ``kube-system``; no RuntimeClass, CRD or HAMi.

    Returns:
        Fresh dicts for ``EmulatedCluster(objects)`` (use ``cluster_hosts(name)`` for its ``hosts``).
    """
    cluster = cluster_spec(name)
    objects: list[dict[str, Any]] = [_namespace(name, ns) for ns in ("default", "kube-system")]
    for i, node in enumerate(cluster.nodes):
        obj = node_object(cluster, node, i)
        meta = obj["metadata"]
        meta["labels"] = {k: v for k, v in meta["labels"].items()
                          if k not in GPU_NODE_LABELS and k != GPU_MODE_LABEL and not k.startswith("nvidia.com/")}
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if not k.startswith("hami.io/")}
        for key in ("capacity", "allocatable"):
            obj["status"][key].pop("nvidia.com/gpu", None)
        objects.append(obj)
    return objects


def cluster_hosts(name: str, **overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Host facts of a demo cluster's nodes for the emulator's check pods and HAMi device-plugin stand-in.

    Args:
        name: cluster name.
        overrides: node name -> facts to change (e.g. ``{"gpu-h100-01": {"nvidia_ctk": None}}``).

    Returns:
        node name -> ``{"nvidia_pci", "nvidia_smi", "nvidia_ctk", "containerd_nvidia_runtime", "mount_nfs",
        "reachable", "hami_register"}`` (see ``demo.emulator``): GPU nodes fully prepared, every node with an NFS
        client and nothing reachable.
    """
    cluster = cluster_spec(name)
    containerd = ("/var/lib/rancher/k3s/agent/etc/containerd/config.toml" if cluster.distribution == "k3s"
                  else "/etc/containerd/config.toml")
    hosts: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        facts: dict[str, Any] = {"nvidia_pci": 0, "mount_nfs": "/usr/sbin/mount.nfs", "reachable": []}
        if node.is_gpu_node:
            facts.update(nvidia_pci=len(node.devices()), nvidia_smi=nvidia_smi_list(node), nvidia_ctk=NVIDIA_CTK_VERSION_OUTPUT,
                         containerd_nvidia_runtime=containerd, hami_register=node.register_annotation())
        facts.update(overrides.get(node.name, {}))
        hosts[node.name] = facts
    return hosts


__all__ = [
    "CSI_DRIVER", "DATA_DIR", "STORAGE_CLASS", "STORAGE_NAMESPACE", "bare_cluster_objects", "cluster_hosts",
    "csi_storage_capacities", "nvidia_smi_list", "storage_objects",
    "FLEET", "ClusterSpec", "GpuFacts", "NodeSpec", "cluster_objects", "cluster_spec", "cluster_version",
    "decode_hami_register", "expected_inventory", "fleet_gpu_uuids", "gfd_labels", "hami_device_plugin_daemonset",
    "node_object", "read_nvidia_smi_csv", "read_nvidia_smi_xml", "runtime_class", "session_crd", "write_seed",
]
