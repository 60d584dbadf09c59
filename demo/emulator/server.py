"""``KubeApiEmulator``: the emulated apiserver assembled from its parts, with the stand-in controllers it feeds."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import re
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import attrs
import kmock

from demo.emulator.auth import AuthMixin
from demo.emulator.common import Outcome
from demo.emulator.control import ControlMixin
from demo.emulator.controllers import Controller
from demo.emulator.controllers.device_plugin import HamiDevicePlugin
from demo.emulator.controllers.envoy_gateway import EnvoyGateway
from demo.emulator.controllers.hami_metrics import SCHEMES
from demo.emulator.controllers.hami_monitor import HamiMonitor
from demo.emulator.controllers.hami_scheduler import HamiScheduler
from demo.emulator.controllers.host_facts import validate_host_facts, validate_hosts
from demo.emulator.controllers.kubelet import Kubelet
from demo.emulator.controllers.tokens import TokensController
from demo.emulator.controllers.volumes import VolumeControllers
from demo.emulator.crud import CrudMixin
from demo.emulator.discovery import DiscoveryMixin
from demo.emulator.events import EventRecorderMixin
from demo.emulator.http import HttpMixin
from demo.emulator.objects import ObjectsMixin
from demo.emulator.proxy import ProxyMixin
from demo.emulator.rbac import UserInfo
from demo.emulator.reads import ReadsMixin
from demo.emulator.resources import BUILTIN_RESOURCES, ResourceSpec
from demo.emulator.store import StoreEvent, StoreMixin


@attrs.define(kw_only=True)
class KubeApiEmulator(HttpMixin, AuthMixin, ProxyMixin, ControlMixin, CrudMixin, ReadsMixin, DiscoveryMixin,
                      EventRecorderMixin, ObjectsMixin, StoreMixin, kmock.KubernetesEmulator):
    """kmock's ``KubernetesEmulator`` made to behave like an apiserver for the official clients.

    The object store is kmock's (``self.objects``); resource metadata is kmock's (``self.resources``,
    filled from ``BUILTIN_RESOURCES`` and from CRDs); watch events go through kmock's buses; request
    dispatch and user reactions (``emulator['get /x'] << ...``) work as in kmock. The apiserver's parts are
    mixins named after what they do (``store``, ``objects``, ``crud``, ``reads``, ``discovery``, ``http``); the
    stand-in controllers (``controllers``) are objects of their own, fed by the store's events (``subscribe``).
    See the package docstring for the behaviour.

    Args (keyword-only):
        server_version: the ``/version`` document (keys ``major``, ``minor``, ``gitVersion`` ... as strings); keys
            it lacks are taken from kmock's default (k3s v1.26.4), None serves that default.
        token: the admin's bearer token (cluster-admin); with it set, a request needs it or a ServiceAccount token
            (see ``demo.emulator.auth``; ServiceAccounts are authorized by RBAC). None: a request without a
            ServiceAccount token is the admin.
        ca_pem: the CA of the server's certificate (PEM), copied into ServiceAccount token Secrets as ``ca.crt``.
        keep_requests: how many past requests to keep for inspection (``list(emulator)``); bounded so a
            long-running demo does not grow.
        history_limit: versions kept per object in ``emulator.objects[...].history`` (None: all).
        event_log_size: watch events kept for ``resourceVersion`` replays; older ones answer ``410 Expired``.
        pod_startup_seconds: None (default) leaves Pods created through the API ``Pending`` as there is no
            scheduler or kubelet. A number of seconds makes the emulator play kube-scheduler with HAMi's
            scheduler extender, HAMi's device plugin and the kubelet for Pods created through the API (see
            ``controllers.hami_scheduler``): the Pod is bound at once to a node that passes the scheduler's filters
            (``nodeName``, ``nodeSelector``, Ready, not cordoned) and, when it asks for HAMi resources
            (``nvidia.com/gpu``/``gpumem``/``gpumem-percentage``/``gpucores``), has room for it with HAMi's sharing
            rules on the GPUs of its ``hami.io/node-nvidia-register`` annotation; GPU pods go to the most used
            node first (binpack), then by name, on GPUs by index, and get HAMi's pod annotations
            (``hami.io/vgpu-devices-allocated`` ..., ``bind-phase: allocating``). That many seconds later it is
            ``Running`` (``bind-phase: success``, ``vgpu-devices-to-allocate`` emptied) with Ready conditions, a
            pod IP from its node's ``podCIDR`` and running container statuses. With no room it stays ``Pending``
            with ``PodScheduled=False``/``Unschedulable`` and kube-scheduler's message, and is tried again when
            a Pod or Node changes (a deleted Pod frees its GPUs) and every ``scheduler_retry_seconds``.
        scheduler_retry_seconds: how often unschedulable Pods are tried again without any change (seconds).
        hosts: host facts per node name (``HOST_FACTS``: what is installed on the node's host, never visible
            through the API); a node without facts is a host with nothing installed and nothing reachable. They
            decide what gShare's attach check pods print and what HAMi's device plugin registers (see
            "gShare attach checks" below); ``set_host`` changes them while serving.
        check_pod_seconds: how long after creation a check pod has ``Succeeded`` (``Running`` half-way).
        device_plugin_seconds: how long after a HAMi device-plugin DaemonSet or a Node label change the device
            plugin stand-in registers the selected nodes.
        volume_controller_seconds: how long after a PVC, PV or StorageClass change the PV controller and CSI
            provisioner stand-ins act (see the module docstring and ``controllers.volumes``).
        hami_monitor_scheme: the metric names HAMi's vGPU monitor stand-in serves: ``current`` (HAMi 2.9+,
            ``hami_container_last_kernel_elapsed_seconds`` ...) or ``legacy`` (HAMi 2.4-2.7,
            ``Device_last_kernel_of_container`` ...; see ``controllers.hami_metrics``).
        hami_monitor_hang_seconds: how long a request to a node's hung monitor (``set_hami_monitor(node, "hang")``)
            waits before the apiserver's 503 (the caller's own time-out is meant to fire first).

    gShare attach checks (always on, whatever ``pod_startup_seconds`` says):

    * a Pod labelled ``app.kubernetes.io/name: gshare-attach-check`` and ``gshare.io/check: node|nfs`` with
      ``spec.nodeName`` set is run by the kubelet stand-in on that node without the scheduler stand-in:
      ``Running``, then ``Succeeded`` (container terminated, exit code 0, ``Completed``); its log
      (``pods/log``) is what ``attach/checks.py``'s script prints on a host with the node's facts
      (``node_check_log``/``nfs_check_log``). A check pod naming a node that does not exist stays ``Pending``
      (and runs if the node appears);
    * HAMi's device plugin: while a DaemonSet labelled (or whose pod template is labelled)
      ``app.kubernetes.io/component: hami-device-plugin`` exists, every Node its template's ``nodeSelector``
      selects whose host facts have ``hami_register`` gets ``hami.io/node-nvidia-register`` (that value),
      ``hami.io/node-handshake: Reported <Go time>`` and ``status.capacity``/``allocatable`` ``nvidia.com/gpu`` =
      the devices' split counts (``operator_agent.hami.decode_node_register``). Nodes carrying a register
      annotation the stand-in did not write (a seed's, e.g. the demo fleet's) are left alone; deleting the
      DaemonSet leaves the annotations (like the real plugin).

    Envoy Gateway (``controllers.envoy_gateway``): once its Deployment ``envoy-gateway-system/envoy-gateway`` exists,
    the status Envoy Gateway writes on GatewayClasses of its controller, their Gateways and the HTTPRoutes attached.

    HAMi's vGPU monitor (always on; ``controllers.hami_monitor``):

    * the DaemonSet's pods: every node such a DaemonSet selects that has ``hami.io/node-nvidia-register`` runs one
      ``Running`` Pod of it (``<daemonset>-<5 alphanumerics>`` in its namespace, the template's labels and containers,
      an ``ownerReference``, ``spec.nodeName``, the node's IP with ``hostNetwork``), ``device_plugin_seconds`` after a
      change; pods on nodes no longer selected, registered or existing are deleted, deleted pods are re-created, and
      deleting the DaemonSet deletes them;
    * the monitor: ``GET /api/v1/namespaces/<ns>/pods/<pod>:9394/proxy/metrics`` on such a pod (its ``vgpu-monitor``
      container; RBAC ``get`` on ``pods/proxy``) answers HAMi's Prometheus text: per (container, GPU) of every Running
      pod on that node with a ``hami.io/vgpu-devices-allocated`` annotation, its last kernel, SM utilization, vGPU
      memory used and limit (the allocation's MiB), and per GPU of the node the host series, in
      ``hami_monitor_scheme``'s names. Other pods, ports and paths answer as a real apiserver's proxy does (``503``
      connection refused, Go's ``404 page not found``; ``demo.emulator.proxy``);
    * busy or idle, per pod (all its containers and GPUs): ``set_gpu_activity(namespace, name, "busy"|"idle")`` or
      ``PUT /emulator/v1/gpu-activity/namespaces/<ns>/pods/<name>`` ``{"state": ...}`` (admin token only,
      ``demo.emulator.control``). A pod is idle from the moment it runs (last kernel = seconds since, utilization 0,
      a CUDA context's memory); idle set later restarts that clock; busy: last kernel 0, utilization 60-99 % and memory
      50-94 % of the limit, fixed per container and GPU;
    * a node's monitor failing: ``set_hami_monitor(node, "down"|"hang"|"ok")`` or ``PUT
      /emulator/v1/gpu-activity/nodes/<node>`` ``{"monitor": ...}``: ``down`` refuses (the proxy's ``503``), ``hang``
      answers nothing for ``hami_monitor_hang_seconds`` (or until set ``ok``).

    Must be created and used inside the event loop that serves it (see ``serve``/``EmulatedCluster``).
    """

    server_version: dict[str, str] | None = None
    token: str | None = None
    ca_pem: bytes | None = None
    keep_requests: int = 1000
    history_limit: int | None = 50
    event_log_size: int = 1000
    pod_startup_seconds: float | None = None
    scheduler_retry_seconds: float = 10.0
    hosts: dict[str, dict[str, Any]] = attrs.field(factory=dict, converter=validate_hosts)
    check_pod_seconds: float = 0.2
    device_plugin_seconds: float = 0.2
    volume_controller_seconds: float = 0.1
    hami_monitor_scheme: str = attrs.field(default="current", validator=attrs.validators.in_(SCHEMES))
    hami_monitor_hang_seconds: float = 60.0

    _rv: int = attrs.field(default=0, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _events: collections.deque = attrs.field(factory=collections.deque, init=False)
    _outcomes: dict[int, Outcome] = attrs.field(factory=dict, init=False)
    _specs: dict[kmock.resource, ResourceSpec] = attrs.field(factory=dict, init=False)
    _issued_tokens: dict[str, tuple[str, str, str, float]] = attrs.field(factory=dict, init=False)  # TokenRequests
    _request_users: dict[int, UserInfo] = attrs.field(factory=dict, init=False)  # id(request) -> who sent it
    # tokens the tokens controller wrote: token -> (namespace, Secret, ServiceAccount, its uid)
    _secret_tokens: dict[str, tuple[str, str, str, str]] = attrs.field(factory=dict, init=False)
    _next_cluster_ip: int = attrs.field(default=10, init=False)
    _listeners: list[Callable[[StoreEvent], None]] = attrs.field(factory=list, init=False)
    _tasks: set = attrs.field(factory=set, init=False)  # the controllers' background tasks
    _events_sent: set[tuple[str, str, str]] = attrs.field(factory=set, init=False)  # (uid, reason, message)
    scheduler: HamiScheduler = attrs.field(init=False)
    kubelet: Kubelet = attrs.field(init=False)
    device_plugin: HamiDevicePlugin = attrs.field(init=False)
    hami_monitor: HamiMonitor = attrs.field(init=False)
    volumes: VolumeControllers = attrs.field(init=False)
    tokens: TokensController = attrs.field(init=False)
    envoy_gateway: EnvoyGateway = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for spec in BUILTIN_RESOURCES:
            self.register(spec)
        for path in ("/healthz", "/livez", "/readyz"):
            self.fallback["get", path] << b"ok"
        self.fallback["get", re.compile(r"/openapi/v3/(api|apis)/.+")] << self._serve_openapi_group_version
        self.fallback["get /openapi/v3"] << self._serve_openapi_root
        self.kubelet = Kubelet(self)
        self.scheduler = HamiScheduler(self, self.kubelet)
        self.device_plugin = HamiDevicePlugin(self)
        self.hami_monitor = HamiMonitor(self)
        self.volumes = VolumeControllers(self)
        self.tokens = TokensController(self)
        self.envoy_gateway = EnvoyGateway(self)
        self.subscribe(self._forget_recorded_events)
        for controller in self.controllers:
            self.subscribe(controller.on_event)
        # Before the FETCH fallback (a higher sub-priority): kmock merges the headers of a returned Response into
        # the reaction serving it for good, so text/plain must stay on a reaction of its own.
        (self.fallback ** 1)["get", re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log")] << self.kubelet.serve_pod_log

    @property
    def controllers(self) -> tuple[Controller, ...]:
        """The stand-in controllers, in the order they hear of each store event."""
        return (self.scheduler, self.kubelet, self.device_plugin, self.hami_monitor, self.volumes, self.tokens, self.envoy_gateway)

    def start_controllers(self) -> None:
        """Let every controller act on the objects already stored (a seed) once serving; call it in the loop."""
        for controller in self.controllers:
            controller.start()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        """Run a controller's coroutine as a task of this emulator (cancelled by ``close_watches``); call it in the
        emulator's loop. Returns the task."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ----------------------------------------------------------------- host facts (never visible through the API)

    def set_host(self, node: str, facts: Mapping[str, Any] | None) -> None:
        """Replace the host facts of a node (None: forget them, the host then has nothing installed).

        Check pods created afterwards see the new facts; HAMi's device plugin stand-in registers the node if it
        now can (a plugin pod crash-looping on a host without a driver starts once the driver is fixed); the kubelet
        retries the mounts of Pods stuck in ``ContainerCreating``. Call it in the emulator's event loop
        (``EmulatedCluster.set_host`` does).

        Raises:
            ValueError: bad facts (see ``HOST_FACTS``).
        """
        if facts is None:
            self.hosts.pop(node, None)
        else:
            self.hosts[node] = validate_host_facts(node, facts)
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to kick yet
            asyncio.get_running_loop()
            for controller in self.controllers:
                controller.on_host_change(node)

    def host_facts(self, node: str) -> dict[str, Any]:
        """A copy of a node's host facts (``{}`` when it has none)."""
        return copy.deepcopy(self.hosts.get(node) or {})

    def pod_log(self, namespace: str, name: str) -> str | None:
        """The log of a live Pod (``""`` before it has one), or None when there is no such Pod."""
        return self.kubelet.pod_log(namespace, name)

    def kick_device_plugin(self) -> None:
        """Schedule a pass of HAMi's device-plugin stand-in (see ``HamiDevicePlugin.kick``)."""
        self.device_plugin.kick()

    # ----------------------------------------------------------------- HAMi's vGPU monitor (never visible through the API)

    def set_gpu_activity(self, namespace: str, name: str, state: str) -> dict[str, Any]:
        """Make every container of a pod ``busy`` or ``idle`` on its HAMi GPUs, as the vGPU monitor reads them (idle:
        the idle clock starts now). Call it in the emulator's loop (``EmulatedCluster.set_gpu_activity`` does).

        Returns:
            ``{"namespace", "name", "uid", "node", "state", "since", "gpus": [...]}`` (``HamiMonitor.describe_activity``).

        Raises:
            KeyError: no such pod. ValueError: a state other than ``busy``/``idle``.
        """
        return self.hami_monitor.set_activity(namespace, name, state)

    def set_hami_monitor(self, node: str, mode: str) -> dict[str, Any]:
        """Make a node's vGPU monitor answer (``ok``), refuse connections (``down``) or hang (``hang``). Call it in the
        emulator's loop (``EmulatedCluster.set_hami_monitor`` does).

        Returns:
            ``{"node", "monitor", "pods": [{"namespace", "name"}]}`` (``HamiMonitor.describe_monitor``).

        Raises:
            KeyError: no such node. ValueError: another mode.
        """
        return self.hami_monitor.set_monitor(node, mode)

    def kick_volume_controller(self) -> None:
        """Schedule a pass of the PV controller stand-in (see ``VolumeControllers.kick``)."""
        self.volumes.kick()
