"""The emulator's own control API under ``/emulator/v1/`` (part of ``KubeApiEmulator``): what tests and the demo
change in the emulated hardware while it serves. No real apiserver has it.

Only the admin token may call it (``kubernetes-admin``; with no ``token`` configured, any request without a
ServiceAccount token is that admin): a ServiceAccount gets ``403 Forbidden`` whatever RBAC grants it, a request
without a valid token ``401``. Errors are Kubernetes ``Status`` documents like the rest of the emulator.

* ``GET|PUT /emulator/v1/gpu-activity/namespaces/{namespace}/pods/{name}``, PUT body ``{"state": "busy"|"idle"}``:
  what the pod's containers do on their HAMi GPUs (``controllers.hami_monitor``); answers 200
  ``HamiMonitor.describe_activity``: ``{"namespace", "name", "uid", "node", "state", "since", "gpus": [...]}``;
* ``GET|PUT /emulator/v1/gpu-activity/nodes/{node}``, PUT body ``{"monitor": "ok"|"down"|"hang"}``: the node's vGPU
  monitor; answers 200 ``HamiMonitor.describe_monitor``: ``{"node", "monitor", "pods": [{"namespace", "name"}]}``.

``404 NotFound`` for an unknown pod, node or path, ``400 BadRequest`` for a body that is not such an object, ``405
MethodNotAllowed`` for another method. ``python -m demo.emulator.activity`` is a command line for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import kmock

from demo.emulator import rbac
from demo.emulator.controllers.hami_monitor import GPU_ACTIVITY_STATES, MONITOR_MODES
from demo.emulator.errors import ApiError
from demo.emulator.rbac import Attributes, UserInfo

CONTROL_PREFIX = "/emulator/v1/"
_POD = re.compile(r"/emulator/v1/gpu-activity/namespaces/([^/]+)/pods/([^/]+)")
_NODE = re.compile(r"/emulator/v1/gpu-activity/nodes/([^/]+)")


def _body_field(request: kmock.Request, field: str, allowed: tuple[str, ...]) -> str:
    data = request.data
    if not isinstance(data, Mapping) or set(data) != {field} or data[field] not in allowed:
        raise ApiError(400, "BadRequest", f'the body must be {{"{field}": "{allowed[0]}"}} with one of '
                       f"{', '.join(allowed)}", None)
    return str(data[field])


class ControlMixin:
    """``/emulator/v1/`` (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    @staticmethod
    def _is_control(request: kmock.Request) -> bool:
        return request.url.path.startswith(CONTROL_PREFIX)

    async def _serve_control(self, request: kmock.Request, user: UserInfo) -> aiohttp.web.StreamResponse:
        """Answer a request of the control API (see the module docstring)."""
        path = request.url.path
        method = str(request.method.value).upper()
        if not user.is_admin:
            attrs = Attributes(verb=method.lower(), resource_request=False, path=path)
            raise ApiError(403, "Forbidden", rbac.forbidden_message(attrs, user), None)
        pod, node = _POD.fullmatch(path), _NODE.fullmatch(path)
        if pod is None and node is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", None)
        if method not in ("GET", "PUT"):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                           None)
        monitor = self.hami_monitor
        async with self._lock:
            try:
                answer: dict[str, Any]
                if pod is not None:
                    namespace, name = pod.groups()
                    answer = (monitor.set_activity(namespace, name, _body_field(request, "state", GPU_ACTIVITY_STATES))
                              if method == "PUT" else monitor.describe_activity(namespace, name))
                else:
                    (name,) = node.groups()
                    answer = (monitor.set_monitor(name, _body_field(request, "monitor", MONITOR_MODES))
                              if method == "PUT" else monitor.describe_monitor(name))
            except KeyError as exc:
                kind = "pods" if pod is not None else "nodes"
                raise ApiError(404, "NotFound", str(exc.args[0]), {"name": name, "kind": kind}) from None
        return aiohttp.web.json_response(answer)
