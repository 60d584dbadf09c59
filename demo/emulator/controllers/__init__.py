"""The emulator's stand-ins for the cluster's controllers, one module each, fed by the store's events.

* ``hami_scheduler`` -- kube-scheduler with HAMi's scheduler extender (rules and formats in ``hami_rules``);
* ``kubelet`` -- the kubelet: runs gShare's attach check pods, starts scheduled Pods, mounts their volumes, serves
  ``pods/log`` (what a host has installed: ``host_facts``);
* ``device_plugin`` -- HAMi's NVIDIA device plugin registering nodes;
* ``hami_monitor`` -- the DaemonSet controller running the device plugin's pods, and their ``vGPUmonitor`` container
  (what it answers through the pod proxy: ``hami_metrics``);
* ``volumes`` -- kube-controller-manager's PersistentVolume controller and a CSI driver's external-provisioner;
* ``tokens`` -- kube-controller-manager's tokens controller, filling ServiceAccount token Secrets;
* ``envoy_gateway`` -- Envoy Gateway's controller: the status of GatewayClasses, Gateways and HTTPRoutes (the demo
  ingress, ``demo/ingress_nginx.py``, does the routing).

Stand-ins still to come go here too, one module each.

A controller is a ``Controller``: the emulator calls ``on_event`` with every store event (``StoreEvent``, in the
emulator's loop and under its lock, so it must not block: it starts a task with ``api.spawn`` for anything that waits),
``on_host_change`` when a node's host facts change, and ``start`` once serving. It reads and writes objects through
the emulator's store (``api.served``, ``api.get_object``, ``api.live_objects``, ``api.write_object``,
``api.add_object``, ``api.record_event``), taking the emulator's lock (``api._lock``, kmock's) in its own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator
    from demo.emulator.store import StoreEvent

logger = logging.getLogger(__name__)


class Controller:
    """Base of the stand-in controllers: every hook does nothing.

    Args:
        api: the emulator the controller watches and writes to.
    """

    def __init__(self, api: KubeApiEmulator) -> None:
        self.api = api

    def on_event(self, event: StoreEvent) -> None:
        """React to a store event (do not block; see the module docstring)."""

    def on_host_change(self, node: str) -> None:
        """React to new host facts of ``node`` (``KubeApiEmulator.set_host``), in the emulator's loop."""

    def start(self) -> None:
        """Act on the objects already stored (a seed), once the emulator serves (in its loop)."""


class DelayedPass:
    """A controller pass run a while after a change, once for all the changes meanwhile (``kick``).

    Args:
        api: the emulator (its lock is held during the pass; its tasks run it).
        run: the pass.
        delay: seconds from a first kick to the pass, read at each kick.
        name: the task's name.
        what: the controller, for the log line of a failed pass (the next kick tries again).
    """

    def __init__(self, api: KubeApiEmulator, run: Callable[[], Awaitable[None]], delay: Callable[[], float], *,
                 name: str, what: str) -> None:
        self._api, self._run, self._delay, self._name, self._what = api, run, delay, name, what
        self._waiting = False

    def kick(self) -> None:
        """Schedule the pass ``delay()`` seconds from now, unless one is already waiting (it will see the current
        state). Without a running loop (a seed being loaded) nothing happens: ``start`` kicks once serving."""
        if self._waiting:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            self._waiting = True
            self._api.spawn(self._after_delay(), self._name)

    async def _after_delay(self) -> None:
        try:
            await asyncio.sleep(self._delay())
            async with self._api._lock:
                self._waiting = False  # a change from now on needs a pass of its own
                await self._run()
        except Exception:  # the next change tries again; the failure is in the log
            logger.exception("the emulated %s failed a pass", self._what)
