"""A Kubernetes API emulator for the demo fleet and the tests, built on kmock's ``KubernetesEmulator``.

The official ``kubernetes`` Python client (and kubectl-style clients) talk to it over plain HTTP on
loopback as if it were an apiserver, or over HTTPS in the opt-in TLS mode (``tls=True``, ``--tls``; see
below). Objects live in kmock's object store (``emulator.objects``, a ``kmock.ObjectsArray`` keyed by
``(kmock.resource, namespace, name)``, each value keeping its history of versions); watch events travel on
kmock's per-resource buses. What this package adds on top of kmock 0.8
(which stores raw dicts and serves them back as they were sent):

* ``/version`` from a configurable dict (kmock hard-codes a k3s v1.26.4 answer);
* discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``, ``/apis/<group>/<version>``) from
  declared resources with their real ``kind``, ``namespaced`` flag, verbs, short names and subresources
  (``BUILTIN_RESOURCES``), plus the resources of every CustomResourceDefinition created or seeded;
* apiserver-like object metadata: ``apiVersion``/``kind``, ``metadata.uid``, ``resourceVersion`` (one
  cluster-wide counter), ``creationTimestamp``, ``generation``; ``generateName``;
* lists with ``kind: <Kind>List``, ``apiVersion``, ``metadata.resourceVersion``, ``limit``/``continue``;
  items sorted by namespace/name and, for built-in kinds, without ``apiVersion``/``kind`` (as the
  apiserver sends them; custom resources keep them);
* ``labelSelector`` (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``,
  ``a>1``, ``a<1``) and ``fieldSelector`` (``=``, ``==``, ``!=`` on ``metadata.name``,
  ``metadata.namespace`` and the per-resource fields of ``FIELD_SELECTORS``, e.g. pods'
  ``spec.nodeName`` and ``status.phase``) on list, watch and deletecollection;
* watch with ``resourceVersion`` (replay from an event log, ``410 Expired`` when compacted),
  ``timeoutSeconds`` (default 1800 s), selector transitions (an object leaving a selector is sent as
  ``DELETED``);
* create (``201``; ``409 AlreadyExists``; ``404`` when the namespace does not exist), replace (``PUT``,
  ``409 Conflict`` on a stale ``metadata.resourceVersion``), patch: JSON patch
  (``application/json-patch+json``), JSON merge patch (``application/merge-patch+json``, RFC 7386),
  strategic merge patch (``application/strategic-merge-patch+json``; **treated as a merge patch**: lists
  are replaced whole and ``$patch``/``$setElementOrder``/``$retainKeys``/``$deleteFromPrimitiveList``
  directives are dropped), server-side apply (``application/apply-patch+yaml`` with the required
  ``fieldManager`` query parameter): the configuration is merged like a merge patch, ``managedFields`` record who
  owns which field (``fieldsV1``), and a field the manager applied before and leaves out now is removed unless another
  manager owns it too; lists are owned whole, conflicts are never reported (see ``demo.emulator.apply``);
* the ``status`` subresource: writes to ``.../status`` change only ``status``; writes to the main
  resource leave ``status`` alone for kinds that have that subresource; create drops ``status`` of
  custom resources whose CRD enables the subresource and sets a Pod's to ``Pending``;
* delete: ``Status`` ``Success`` (Pods and custom resources: the deleted object), finalizers make it a
  ``deletionTimestamp`` update and the object goes once they are removed; deleting a Namespace deletes its
  objects, deleting an owner deletes its dependents (``ownerReferences``), deleting a CRD deletes its
  resource and objects; ``404 NotFound`` as a proper ``Status``;
* errors as ``Status`` objects with the apiserver's ``reason`` (``NotFound``, ``AlreadyExists``,
  ``Conflict``, ``Invalid``, ``BadRequest``, ``MethodNotAllowed``, ``UnsupportedMediaType``,
  ``Unauthorized``, ``Forbidden``, ``Expired``, ``InternalError``);
* identities (``auth``): an optional admin bearer token (cluster-admin, ``system:masters``): with ``token`` set, a
  request with neither it nor a ServiceAccount token (health endpoints included) gets ``401 Unauthorized``;
  ServiceAccount tokens from Secrets of type ``kubernetes.io/service-account-token`` (filled right after create by the
  tokens controller stand-in, ``controllers.tokens``: ``token``, ``namespace``, ``ca.crt`` with TLS; never expire, revoked with the Secret or the
  ServiceAccount) and from TokenRequests (``POST .../serviceaccounts/<name>/token``, expiring);
  ``SelfSubjectAccessReview`` and ``SelfSubjectRulesReview`` answer for the caller;
* RBAC for ServiceAccount tokens (``rbac``), on every request: Roles, ClusterRoles, RoleBindings and
  ClusterRoleBindings with verbs, apiGroups, resources and subresources (``pods/log``, ``*/status``), resourceNames
  and ``*``, plus the bootstrap policy of every authenticated user (discovery, ``/version``, health, self reviews);
  a server-side apply that creates an object needs ``create`` too; a refused request gets the apiserver's ``403
  Forbidden`` (``nodes is forbidden: User "system:serviceaccount:ns:sa" cannot list resource "nodes" in API group
  "" at the cluster scope``);
* opt-in TLS (``EmulatedCluster(tls=True)``, ``serve(tls=...)``, ``--tls``): HTTPS with a throwaway self-signed CA
  and a server certificate it signs for ``IP:127.0.0.1``, ``DNS:localhost`` and the configured loopback host,
  generated at start and kept in memory (``ServerCertificates``, ``generate_certificates``; ``ssl`` loads a key only
  from a file, so it is written to a private temporary directory removed once loaded); ``kubeconfig()`` then carries
  the CA as ``certificate-authority-data`` and the CLI's ready file as ``ca_data``. client-go (so Helm and kubectl)
  sends a kubeconfig user's bearer token only over TLS: against the plain-HTTP server it sends no ``Authorization``
  header and gets ``401`` once a token is required. Plain HTTP stays the default;
* custom resources checked against their CRD's ``openAPIV3Schema`` on every write and seed (``schema``): unknown
  fields pruned, defaults filled, structural-schema rules (``type``, ``required``, ``enum``, ``pattern``, lengths,
  bounds, item counts, ``format``, ``nullable``, ``x-kubernetes-int-or-string``/``preserve-unknown-fields``) refused
  with the apiserver's ``422 Invalid`` and ``details.causes``; CEL ``x-kubernetes-validations`` are not evaluated;
* ``dryRun=All`` on create/patch/replace/delete;
* Services get a ``spec.clusterIP`` (from 10.96.0.0/16) when they ask for one;
* opt-in (``pod_startup_seconds``): a stand-in for kube-scheduler with HAMi's scheduler extender, HAMi's
  device plugin and the kubelet. Pods created through the API are bound to a node with room for their
  HAMi GPU request (``nvidia.com/gpu``, ``nvidia.com/gpumem`` MiB, ``nvidia.com/gpumem-percentage``,
  ``nvidia.com/gpucores`` percent), read from each node's ``hami.io/node-nvidia-register`` annotation with
  ``operator_agent.hami``, get HAMi's pod annotations in the real format (``hami.io/vgpu-devices-allocated:
  GPU-…,NVIDIA,<MiB>,<cores %>:;`` ...) and run; Pods that do not fit stay ``Pending``/``Unschedulable``
  with kube-scheduler's message until a Pod or Node change makes room (see ``KubeApiEmulator``);
* host facts (``hosts``: per node, what is installed on its host -- NVIDIA GPUs on the PCI bus, ``nvidia-smi -L``,
  ``nvidia-ctk --version``, containerd's ``nvidia`` runtime, ``mount.nfs``, reachable ``host:port`` targets, the
  HAMi register value; ``HOST_FACTS``), never visible through the API, changeable while serving (``set_host``),
  and what ``manage.py attach_cluster`` learns from them, always on: its check pods (label
  ``app.kubernetes.io/name: gshare-attach-check``, ``gshare.io/check: node|nfs``, bound with ``spec.nodeName``)
  are run by a kubelet stand-in without the scheduler (``Running``, then ``Succeeded``) and log what the check
  script prints on such a host; HAMi's device plugin stand-in registers the nodes a ``hami-device-plugin``
  DaemonSet selects (``hami.io/node-nvidia-register``, ``hami.io/node-handshake``, ``nvidia.com/gpu`` capacity)
  once the DaemonSet exists or a node gets the selected label (see ``KubeApiEmulator``);
* ``pods/log`` (``GET``, ``text/plain``; the check pods' logs, ``""`` for other pods; ``container``,
  ``tailLines``, ``limitBytes``);
* always on, HAMi's device-plugin pods and their vGPU monitor (``controllers.hami_monitor``): while a HAMi device-plugin
  DaemonSet exists, every node it selects that has HAMi-registered GPUs runs one Pod of it as the DaemonSet controller
  makes them (``<daemonset>-<5 alphanumerics>``, the template's labels and containers, an ``ownerReference``,
  ``spec.nodeName``, ``Running`` with a pod IP; gone with the DaemonSet, the node or its selection), and its
  ``vgpu-monitor`` container answers ``GET .../pods/<pod>:9394/proxy/metrics`` with HAMi's per-container metrics of the
  GPU pods on that node (one series per container and GPU, from their ``hami.io/vgpu-devices-allocated``; last kernel,
  SM utilization, vGPU memory used and limit, and the host GPU series) in HAMi's ``current`` (2.9+) or ``legacy``
  (2.4-2.7) names (``hami_monitor_scheme``, ``--hami-monitor-scheme``; ``controllers.hami_metrics``);
* the pod proxy subresource (``proxy``: ``[scheme:]name[:port]``, RBAC ``get`` on ``pods/proxy``, ``404``/``400
  address not allowed``/``503 error trying to reach service: ... connection refused`` as the apiserver answers): only
  the vGPU monitor listens, every other pod and port refuses;
* the emulator's own control API (``control``, admin token only; ServiceAccounts ``403``): ``PUT
  /emulator/v1/gpu-activity/namespaces/<ns>/pods/<name>`` ``{"state": "busy"|"idle"}`` sets what a pod's containers do
  on their GPUs as the monitor reads it (default: idle since it started running; idle's clock starts when set), and
  ``PUT /emulator/v1/gpu-activity/nodes/<node>`` ``{"monitor": "ok"|"down"|"hang"}`` makes a node's monitor refuse
  (``503``) or hang; ``GET`` on either shows the current state; also ``KubeApiEmulator.set_gpu_activity``/
  ``set_hami_monitor``, ``EmulatedCluster``'s methods of the same names and ``python -m demo.emulator.activity``;
* always on, stand-ins for kube-controller-manager's PersistentVolume controller and a CSI driver's external-provisioner
  (``controllers.volumes``), ~``volume_controller_seconds`` (0.1 s) after a PVC, PV or
  StorageClass change: a PVC whose StorageClass's provisioner is a CSI driver gets PV ``pvc-<PVC uid>`` (``csi``
  driver/new volume handle/``fsType`` from the class, ``nfs`` by default; capacity = request; the class's reclaim policy,
  ``Delete`` by default, and mount options; ``claimRef``) and both are ``Bound``, with the ``ExternalProvisioning``,
  ``Provisioning`` and ``ProvisioningSucceeded`` Events; a PVC naming a PV (``spec.volumeName``, e.g. pre-bound after a
  volume move) or named by an ``Available`` PV's ``claimRef`` is bound to it, or gets the controller's ``FailedBinding``
  (``volume "x" already bound to a different claim.``) or ``VolumeMismatch`` Warning; a PVC whose StorageClass does not
  exist stays ``Pending`` with ``ProvisioningFailed`` ``storageclass.storage.k8s.io "<name>" not found``; a deleted PVC's
  PV is deleted (``Delete``) or ``Released`` (``Retain``, ``claimRef`` kept); a ``Bound`` PVC whose PV is gone is
  ``Lost`` (``ClaimLost``). Create defaults as the apiserver's: status ``Pending``, ``volumeMode: Filesystem``, a PV's
  ``Retain``, the default StorageClass (``storageclass.kubernetes.io/is-default-class``) for a PVC naming none;
* with the scheduler/kubelet stand-in, Pods with ``persistentVolumeClaim`` volumes: not bound to a node while a PVC is
  missing or not ``Bound`` (kube-scheduler's VolumeBinding messages: ``persistentvolumeclaim "x" not found``, ``pod has
  unbound immediate PersistentVolumeClaims``); once bound, the kubelet mounts them first: on a node whose host facts
  say no NFS client (``mount_nfs`` missing/None; a node without any host facts is not judged) an NFS volume (CSI
  ``fsType: nfs``/NFS driver, or in-tree ``nfs``) does not mount, and the Pod stays ``Pending`` in
  ``ContainerCreating`` (no pod IP) with a Warning ``FailedMount`` Event carrying the kubelet's real text
  (``nfs_mount_failure_message``) until ``set_host`` gives the node an NFS client.

Not emulated: aggregated ClusterRoles, RBAC's escalation and bind checks, other authorizers (Node, Webhook),
impersonation, JWT tokens (ServiceAccount tokens are opaque random strings), admission (HAMi's webhook does not set
``schedulerName``; only the DefaultStorageClass plugin is), volume binding modes (``WaitForFirstConsumer`` classes bind
at once, like ``Immediate``), static binding of a PVC to any matching unclaimed PV (only the two pre-bound cases above),
PV/PVC protection finalizers, volume expansion, snapshots, attach/detach, CSI drivers' own behaviour (a class's CSI
driver always provisions, whether or not it is installed; no CSIStorageCapacity is ever written: seed them), field
validation of built-in kinds against their schemas, CEL rules of CRDs, controllers (Deployments and DaemonSets keep the status they were given; only HAMi's
device-plugin DaemonSet gets Pods, see above; no rolling updates), scheduling beyond the stand-in above
(taints/tolerations, affinity, CPU/memory fit, preemption, HAMi's MIG geometries: ``mig``-mode GPUs are shared
like ``hami-core`` ones, by memory, cores and split count), running containers (only check pods "run", by
their known output; the vGPU monitor answers from the state set through the control API), ``exec``/``attach``/
``portforward``/``scale``, the ``proxy`` of nodes and Services and other subresources besides ``status``, ``pods/log``
and ``pods/proxy`` (``404``), ``pods/log`` streaming (``follow``) and timestamps, protobuf/CBOR (except
the protobuf ``Secret``/``ConfigMap`` request bodies Helm's release storage sends, decoded by ``demo.k8s_protobuf``;
responses are always JSON), aggregated discovery (clients fall back to the legacy documents served here), OpenAPI
schemas (``/openapi/v3`` serves only what client-go's field-validation check reads), client certificates.

Entry points:

* ``EmulatedCluster`` – a thread-backed server for tests and scripts (``start()``/``stop()``, context
  manager);
* ``serve()`` – the same as an async context manager for code that already runs an event loop;
* ``python -m demo.emulator --seed PATH --port N [--tls] [--hami-monitor-scheme current|legacy]`` – a process serving
  a seed file until SIGTERM/SIGINT;
* ``python -m demo.emulator.activity --url URL --token-file F pod NS/NAME [busy|idle]`` / ``node NODE [ok|down|hang]``
  – the control API from a shell (``activity``).

Where things are (one module each):

* the API server: ``server`` (``KubeApiEmulator``, assembled from the parts below), ``store`` (objects, resource
  versions, the event log and the listeners the controllers subscribe with), ``objects`` (create-time defaults, CRDs),
  ``schema`` (custom resources against their CRD's schema), ``crud`` (create, replace, patch, delete), ``patches``
  (merge patches), ``apply`` (server-side apply and field ownership), ``reads`` (get, list, watch), ``selectors``,
  ``discovery``, ``http`` (request parsing, errors), ``auth`` (identities, self reviews, TokenRequests), ``rbac``
  (RBAC evaluation), ``proxy`` (``pods/proxy``), ``control`` (``/emulator/v1/``), ``errors``, ``events`` (Events as
  components record them), ``resources`` (what is served);
* the stand-in controllers, fed by the store's events: ``controllers.hami_scheduler`` (with ``hami_rules``),
  ``controllers.kubelet`` (with ``host_facts``), ``controllers.device_plugin``, ``controllers.hami_monitor`` (the
  device-plugin pods and their vGPU monitor, its metrics in ``controllers.hami_metrics``), ``controllers.volumes``,
  ``controllers.tokens``;
* serving: ``cluster`` (``serve``, ``EmulatedCluster``), ``tls``, ``cli`` (``python -m demo.emulator``), ``activity``
  (``python -m demo.emulator.activity``).

This package must not import Django (the demo starts one emulator process per cluster and they must
start fast): it imports only the standard library, aiohttp, attrs, jsonpatch, jsonschema, PyYAML, kmock, the ``kubernetes`` client's quantity
parser (through ``contract.quantity``), ``contract`` (standard library only: the monitor's port),
``demo.k8s_protobuf``
(Google's ``protobuf`` runtime), ``operator_agent.hami``/``operator_agent.hami_pods`` (standard library only: the
operator's decoders of HAMi's node-register and pod-allocation annotations, so each format has one decoder) and,
in TLS mode only (imported when certificates are generated), ``cryptography``.
"""

from __future__ import annotations

from contract.quantity import parse_quantity
from demo.emulator.apply import BEFORE_FIRST_APPLY
from demo.emulator.cli import main
from demo.emulator.cluster import EmulatedCluster, serve
from demo.emulator.controllers.device_plugin import (
    HAMI_DEVICE_PLUGIN_COMPONENT,
    HAMI_DEVICE_PLUGIN_LABEL,
    HAMI_NODE_HANDSHAKE,
    HAMI_NODE_REGISTER,
    go_time_string,
)
from demo.emulator.controllers.hami_metrics import SCHEME_CURRENT, SCHEME_LEGACY, go_float, render_metrics
from demo.emulator.controllers.hami_monitor import (
    GPU_ACTIVITY_STATES,
    HAMI_MONITOR_CONTAINER,
    HAMI_MONITOR_PORT,
    IDLE_MEMORY_BYTES,
    MONITOR_MODES,
)
from demo.emulator.controllers.hami_rules import (
    HAMI_BIND_PHASE,
    HAMI_BIND_TIME,
    HAMI_DEVICE_TYPE,
    HAMI_DEVICES_ALLOCATED,
    HAMI_DEVICES_TO_ALLOCATE,
    HAMI_NOUSE_GPUTYPE,
    HAMI_NOUSE_GPUUUID,
    HAMI_RESOURCE_CORES,
    HAMI_RESOURCE_COUNT,
    HAMI_RESOURCE_MEMORY,
    HAMI_RESOURCE_MEMORY_PERCENTAGE,
    HAMI_USE_GPUTYPE,
    HAMI_USE_GPUUUID,
    HAMI_VGPU_NODE,
    HAMI_VGPU_TIME,
    GpuAllocation,
    GpuRequest,
    encode_pod_devices,
    pod_gpu_requests,
)
from demo.emulator.controllers.host_facts import (
    CHECK_KIND_LABEL,
    CHECK_KINDS,
    CHECK_POD_LABEL,
    CHECK_POD_LABEL_VALUE,
    CHECK_PREFIX,
    CHECK_TARGETS_ENV,
    HOST_FACTS,
    check_pod_kind,
    nfs_check_log,
    node_check_log,
    validate_host_facts,
    validate_hosts,
)
from demo.emulator.controllers.volumes import (
    CLAIM_LOST_MESSAGE,
    DEMOCRATIC_CSI_MOUNT_WRAPPER,
    NFS_HELPER_MISSING,
    PROVISIONED_BY_ANNOTATION,
    PV_CONTROLLER,
    external_provisioning_message,
    nfs_mount_failure_message,
    storage_class_not_found_message,
)
from demo.emulator.errors import ApiError
from demo.emulator.objects import DEFAULT_STORAGE_CLASS_ANNOTATION
from demo.emulator.patches import merge_patch
from demo.emulator.resources import BUILTIN_RESOURCES, FIELD_SELECTORS, ResourceSpec, iter_resources
from demo.emulator.selectors import FieldRequirement, LabelRequirement, parse_field_selector, parse_label_selector
from demo.emulator.server import KubeApiEmulator
from demo.emulator.store import StoreEvent
from demo.emulator.tls import ServerCertificates, generate_certificates

__all__ = [
    "ApiError", "BEFORE_FIRST_APPLY", "BUILTIN_RESOURCES", "CHECK_KINDS", "CHECK_KIND_LABEL", "CHECK_POD_LABEL",
    "CHECK_POD_LABEL_VALUE", "CHECK_PREFIX", "CHECK_TARGETS_ENV", "CLAIM_LOST_MESSAGE", "DEFAULT_STORAGE_CLASS_ANNOTATION",
    "DEMOCRATIC_CSI_MOUNT_WRAPPER", "EmulatedCluster", "FIELD_SELECTORS", "FieldRequirement", "GPU_ACTIVITY_STATES",
    "GpuAllocation", "HAMI_MONITOR_CONTAINER", "HAMI_MONITOR_PORT", "IDLE_MEMORY_BYTES", "MONITOR_MODES",
    "SCHEME_CURRENT", "SCHEME_LEGACY", "go_float", "render_metrics",
    "GpuRequest", "HAMI_BIND_PHASE", "HAMI_BIND_TIME", "HAMI_DEVICES_ALLOCATED", "HAMI_DEVICES_TO_ALLOCATE",
    "HAMI_DEVICE_PLUGIN_COMPONENT", "HAMI_DEVICE_PLUGIN_LABEL", "HAMI_DEVICE_TYPE", "HAMI_NODE_HANDSHAKE",
    "HAMI_NODE_REGISTER", "HAMI_NOUSE_GPUTYPE", "HAMI_NOUSE_GPUUUID", "HAMI_RESOURCE_CORES", "HAMI_RESOURCE_COUNT",
    "HAMI_RESOURCE_MEMORY", "HAMI_RESOURCE_MEMORY_PERCENTAGE", "HAMI_USE_GPUTYPE", "HAMI_USE_GPUUUID",
    "HAMI_VGPU_NODE", "HAMI_VGPU_TIME", "HOST_FACTS", "KubeApiEmulator", "LabelRequirement", "NFS_HELPER_MISSING",
    "PROVISIONED_BY_ANNOTATION", "PV_CONTROLLER", "ResourceSpec", "ServerCertificates", "StoreEvent",
    "check_pod_kind", "encode_pod_devices", "external_provisioning_message", "generate_certificates",
    "go_time_string", "iter_resources", "main", "merge_patch", "nfs_check_log", "nfs_mount_failure_message",
    "node_check_log", "parse_field_selector", "parse_label_selector", "parse_quantity", "pod_gpu_requests", "serve",
    "storage_class_not_found_message", "validate_host_facts", "validate_hosts",
]
