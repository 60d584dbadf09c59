"""The pod proxy subresource (part of ``KubeApiEmulator``): ``/api/v1/namespaces/{ns}/pods/{name}/proxy/{path}``.

What the apiserver does (``pkg/registry/core/pod/strategy.go`` ``ResourceLocation``, ``rest/subresources.go``
``ProxyREST``, apimachinery ``pkg/util/proxy/transport.go``), and so the emulator:

* the name is ``[scheme:]name[:port]`` (``utilnet.SplitSchemeNamePort``: scheme ``http``, ``https`` or none; more
  parts, an empty name or another scheme: ``400 BadRequest`` ``invalid pod request "<id>"``); the official client sends
  ``connect_get_namespaced_pod_proxy_with_path(name="pod:9394", namespace, path="metrics")`` as
  ``GET /api/v1/namespaces/<ns>/pods/pod%3A9394/proxy/metrics`` (path parameters are percent-encoded whole);
* authorization is RBAC's on resource ``pods``, subresource ``proxy``, the verb of the HTTP method (``get`` for GET),
  the name being the whole ``[scheme:]name[:port]``;
* the path is what follows ``/proxy/`` (else the ``path`` query parameter); no port: the first ``containerPort`` of the
  pod's containers, else the scheme's default;
* a missing pod is ``404 NotFound``; a pod without a global-unicast pod IP (Pending, no sandbox yet) is ``400
  BadRequest`` ``address not allowed``;
* the pod's answer is passed through as it is (status, ``Content-Type``, body); when nothing answers, the apiserver's
  ``503 ServiceUnavailable`` Status ``error trying to reach service: dial tcp <ip>:<port>: connect: connection refused``.

Only HAMi's vGPU monitor answers (``controllers.hami_monitor.HamiMonitor.answer``); every other pod and port refuses
the connection, as a container that is not listening would. A hung monitor holds the request without the lock, then
gets the 503 of a dial time-out. Nodes' and Services' proxies are not emulated (``404``).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import aiohttp.web
import kmock

from demo.emulator.controllers.hami_monitor import MonitorAnswer
from demo.emulator.errors import ApiError, not_found

_SCHEMES = ("", "http", "https")


def split_scheme_name_port(value: str) -> tuple[str, str, str] | None:
    """``(scheme, name, port)`` of ``[scheme:]name[:port]`` as ``utilnet.SplitSchemeNamePort`` splits it, or None."""
    parts = value.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, name, port = "", parts[0], parts[1]
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        return None
    return (scheme, name, port) if name and scheme in _SCHEMES else None


def _global_unicast(address: str) -> bool:
    """Go's ``net.IP.IsGlobalUnicast``: not unspecified, loopback, multicast, link-local or the broadcast address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    broadcast = ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255")
    return not (ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_link_local or broadcast)


class ProxyMixin:
    """``pods/proxy`` (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    @staticmethod
    def _is_pod_proxy(request: kmock.Request) -> bool:
        resource = request.resource
        return (resource is not None and (resource.group or "") == "" and resource.plural == "pods"
                and request.name is not None and request.namespace is not None
                and (request.subresource or "").split("/")[0] == "proxy")

    async def _serve_pod_proxy(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Answer an authorized pod proxy request (see the module docstring)."""
        pods = self.served("", "v1", "pods")
        split = split_scheme_name_port(request.name or "")
        if split is None:
            raise ApiError(400, "BadRequest", f'invalid pod request "{request.name}"', None)
        scheme, name, port = split
        subpath = (request.subresource or "").partition("/")[2]
        path = subpath or request.params.get("path", "")
        hung = False
        while True:
            async with self._lock:
                pod = self.get_object(pods, request.namespace, name)
                if pod is None:
                    raise not_found(pods, name)
                address = next((entry.get("ip") for entry in (pod.get("status") or {}).get("podIPs") or []), "") or ""
                if not _global_unicast(address):
                    raise ApiError(400, "BadRequest", "address not allowed", None)
                if not port:
                    port = next((str(p["containerPort"]) for c in (pod.get("spec") or {}).get("containers") or []
                                 for p in (c.get("ports") or [])[:1] if "containerPort" in p), "")
                answer = self.hami_monitor.answer(pod, address, port, scheme, path)
            if not answer.hang:
                break
            if hung:
                target = f"{address}:{port or (443 if scheme == 'https' else 80)}"
                answer = MonitorAnswer(unreachable=f"dial tcp {target}: i/o timeout")
                break
            await self.hami_monitor.hang(pod)
            hung = True
        if answer.unreachable is not None:
            raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: {answer.unreachable}", None)
        headers: dict[str, Any] = {"Content-Type": answer.content_type}
        if answer.status == 404:
            headers["X-Content-Type-Options"] = "nosniff"
        return aiohttp.web.Response(status=answer.status, body=answer.body, headers=headers)
