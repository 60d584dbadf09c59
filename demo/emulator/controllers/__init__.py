"""The emulator's stand-ins for the cluster's controllers, one module each, fed by the store's events.

* ``hami_scheduler`` -- kube-scheduler with HAMi's scheduler extender (rules and formats in ``hami_rules``);
* ``kubelet`` -- the kubelet: runs gShare's attach check pods, starts scheduled Pods, mounts their volumes, serves
  ``pods/log`` (what a host has installed: ``host_facts``);
* ``device_plugin`` -- HAMi's NVIDIA device plugin registering nodes;
* ``volumes`` -- kube-controller-manager's PersistentVolume controller and a CSI driver's external-provisioner.

Stand-ins still to come go here too, one module each, e.g. an ingress controller and HAMi's vGPU monitor.

A controller is a ``Controller``: the emulator calls ``on_event`` with every store event (``StoreEvent``, in the
emulator's loop and under its lock, so it must not block: it starts a task with ``api.spawn`` for anything that waits),
``on_host_change`` when a node's host facts change, and ``start`` once serving. It reads and writes objects through
the emulator's store (``api._current``, ``api._live``, ``api._write``, ``api._emit``), taking ``api._lock`` in its
own tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator
    from demo.emulator.store import StoreEvent


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
