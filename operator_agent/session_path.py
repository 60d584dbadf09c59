"""Checks of a session's path, made from inside the cluster and reported with the inventory (``checks``).

A session URL is ``https://<session_domain>/s/<id>/``: the browser resolves ``session_domain`` and lands on the ingress
controller, which asks the control plane's ``/internal/connect/verify`` (the Ingress's ``auth-url``) before it lets
the request through. Neither step is visible from the control plane, so the operator checks both from where they
happen and the connection test shows the result:

* ``session_domain_resolves``: ``session_domain`` resolves here to an address of the ingress node (its
  ``status.addresses``). A name that does not resolve, or resolves elsewhere, is the "sessions start but the URL 404s"
  of the attach guide.
* ``verify_reachable``: the ``auth-url`` answers a request without a token with 401 and the control plane's JSON body
  (``token_missing``). A connection error, an HTML page or any other answer makes ingress-nginx answer 401/500 to
  every user, which is the guide's "connecting returns 401". On a ``gateway-api`` cluster the same probe goes to the
  ext_authz URL as Envoy calls it (``<connect_ext_authz_url>/``: the prefix with the original path ``/`` appended),
  where a failure makes Envoy Gateway refuse every session request.

What to check comes from the control plane's answer to the inventory (``session_domain``, ``ingress_node``,
``connect_verify_url``: ``contract.INVENTORY_RESPONSE_SESSION_PATH_KEYS``; ``routing``, ``connect_ext_authz_url``:
``contract.INVENTORY_RESPONSE_ROUTING_KEYS``), so a ``PATCH`` of the cluster is checked at
the next tick. The operator token is never sent to the ``auth-url``.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import requests

from contract import (
    INVENTORY_RESPONSE_ROUTING_KEYS,
    INVENTORY_RESPONSE_SESSION_PATH_KEYS,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
    SESSION_DOMAIN_RESOLVES,
    VERIFY_REACHABLE,
)
from contract.rfc3339 import format_utc
from operator_agent import kube
from operator_agent.control_plane_client import USER_AGENT, explain_answer, explain_connection_error

__all__ = ["SessionPathChecks", "check_session_domain", "check_verify"]

logger = logging.getLogger(__name__)

#: Seconds each check may take at most (DNS lookups are bounded by the resolver's own timeout).
CHECK_TIMEOUT = 5.0
_DETAIL_MAX = 1000

Resolver = Callable[[str], list[str]]


#: RFC 6761 section 6.3: ``localhost`` and names under it are loopback, and browsers resolve them so without asking DNS
#: (glibc does not), so a session at ``lab.localhost`` reaches an ingress on this machine (the demo's).
LOOPBACK_NAMES = ("127.0.0.1", "::1")


def _resolve(host: str) -> list[str]:
    """Addresses ``host`` resolves to here (the pod's resolver: the cluster's DNS), sorted, without duplicates."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return sorted(LOOPBACK_NAMES)
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


def _now() -> str:
    return format_utc(datetime.datetime.now(datetime.UTC))


def _result(ok: bool, detail: str) -> dict:
    return {"ok": ok, "detail": detail[:_DETAIL_MAX], "checked_at": _now()}


def check_session_domain(core_v1: kube.CoreV1Api, *, session_domain: str, ingress_node: str,
                         timeout: float = CHECK_TIMEOUT, resolve: Resolver = _resolve) -> dict | None:
    """Whether ``session_domain`` resolves, from this pod, to an address of the node ``ingress_node``.

    Args:
        core_v1: client of this cluster's apiserver (reads the ingress node).
        session_domain: the cluster's ``session_domain`` as registered ("" = nothing to check).
        ingress_node: the cluster's ``ingress_node`` as registered ("" = the name only has to resolve).
        timeout: seconds for reading the node.
        resolve: host -> addresses (the system resolver by default).

    Returns:
        ``{"ok", "detail", "checked_at"}`` (contract ``_OPERATOR_CHECK``), or None when there is nothing to check or the
        node could not be read (an apiserver hiccup is not a verdict on the DNS record).
    """
    if not session_domain:
        return None
    try:
        addresses = resolve(session_domain)
    except (OSError, UnicodeError) as exc:
        return _result(False, (
            f"{session_domain} does not resolve inside the cluster ({exc}): create its DNS record (an A record pointing at "
            f"the ingress node{' ' + ingress_node if ingress_node else ''}'s address), or give the cluster a session_domain "
            "that has one"
        ))
    if not ingress_node:
        return _result(True, f"{session_domain} resolves to {', '.join(addresses)} (no ingress_node registered to compare with)")
    try:
        with kube.apiserver_call():
            node = core_v1.read_node(ingress_node, _request_timeout=timeout)
    except kube.ApiException as exc:
        if exc.status == 404:
            return _result(False, (
                f"{session_domain} resolves to {', '.join(addresses)}, but the registered ingress_node {ingress_node} is not "
                "a node of this cluster: register the node that runs the ingress controller as ingress_node"
            ))
        logger.warning("session path check: cannot read node %s: %s %s", ingress_node, exc.status, exc.reason)
        return None
    except kube.KubeUnavailable as exc:
        logger.warning("session path check: cannot reach the apiserver to read node %s: %s", ingress_node, exc)
        return None
    node_addresses = sorted({a.address for a in (node.status.addresses if node.status else None) or [] if a.address})
    if set(addresses) & set(node_addresses):
        return _result(True, f"{session_domain} resolves to {', '.join(addresses)}, an address of the ingress node {ingress_node}")
    return _result(False, (
        f"{session_domain} resolves to {', '.join(addresses)}, which is not an address of the ingress node {ingress_node} "
        f"({', '.join(node_addresses) or 'it lists none'}): point its DNS record at the ingress node, or give the cluster a "
        "session_domain that does"
    ))


def check_verify(http: requests.Session, url: str, *, timeout: float = CHECK_TIMEOUT,
                 routing: str = ROUTING_INGRESS_NGINX) -> dict | None:
    """Whether the ``auth-url`` ``url`` answers a request without a token as the control plane does (401, JSON).

    Args:
        http: a session that carries no credentials.
        url: the control plane's ``/internal/connect/verify`` as put on session Ingresses, or for ``gateway-api`` routing
            the ext_authz URL Envoy calls (``<connect_ext_authz_url>/``) ("" = nothing to check).
        timeout: seconds for the request.
        routing: the cluster's routing mode (``contract.ROUTING_MODES``), which words the result.

    Returns:
        ``{"ok", "detail", "checked_at"}``, or None when ``url`` is empty.
    """
    if not url:
        return None
    if routing == ROUTING_GATEWAY_API:
        where = (f"The session routes' ext_authz URL {url}, which Envoy Gateway calls (SecurityPolicy extAuth) for every "
                 "session request,")
        proxy = "Envoy Gateway"
    else:
        where = f"The session Ingresses' auth-url {url}, which the ingress controller calls for every session request,"
        proxy = "ingress-nginx"
    try:
        response = http.get(url, headers={"Accept": "application/json", "User-Agent": USER_AGENT}, timeout=timeout,
                            allow_redirects=False)
    except requests.RequestException as exc:
        return _result(False, f"{where} cannot be reached from this cluster: {explain_connection_error(exc, url, timeout=timeout)}")
    try:
        body = response.json()
    except ValueError:
        body = None
    code = body.get("code") if isinstance(body, dict) else None
    if response.status_code == 401 and code:
        return _result(True, f"{where} answers 401 {code} to a request without a token, as it should")
    explained = explain_answer(response.status_code, url, code=code, foreign=not isinstance(body, dict),
                               location=response.headers.get("Location") or "")
    if not explained and response.status_code >= 500:
        explained = (
            f"it answered {response.status_code}{' ' + code if code else ''}: the control plane behind it is failing or not "
            f"running (its api pods, database or Redis), and {proxy} refuses every session request meanwhile"
        )
    elif not explained:
        explained = (
            f"it answered {response.status_code}{' ' + code if code else ''} where the control plane answers 401 to a "
            "request without a token: check that the URL is the control plane's (its chart's `controlPlaneUrl`)"
        )
    return _result(False, f"{where} does not answer as the control plane: {explained}")


@dataclass
class SessionPathChecks:
    """The latest results of the session-path checks, sent with the next inventory (``snapshot["checks"]``).

    ``update`` runs them with what the control plane's inventory answer named; ``payload`` is what to send.
    """

    results: dict[str, dict] = field(default_factory=dict)
    http: requests.Session = field(default_factory=requests.Session)

    def payload(self) -> dict[str, dict]:
        """Check name -> ``{"ok", "detail", "checked_at"}`` of the last run (empty before the first)."""
        return dict(self.results)

    def update(self, core_v1: kube.CoreV1Api, answer: Mapping[str, object], *, timeout: float = CHECK_TIMEOUT) -> None:
        """Run both checks with the ``session_domain``, ``ingress_node`` and ``connect_verify_url`` of ``answer`` -- or,
        when its ``routing`` is ``gateway-api``, its ``connect_ext_authz_url`` (probed as ``<url>/``, what Envoy asks for
        a request of ``/``).

        A control plane that does not send them (older than this operator) leaves nothing to check. A check that
        fails is logged as a warning with its fix; one that passes again is logged once.
        """
        session_domain, ingress_node, verify_url = (str(answer.get(key) or "") for key in INVENTORY_RESPONSE_SESSION_PATH_KEYS)
        routing, ext_authz_url = (str(answer.get(key) or "") for key in INVENTORY_RESPONSE_ROUTING_KEYS)
        if routing == ROUTING_GATEWAY_API and ext_authz_url:
            verify_url = ext_authz_url.rstrip("/") + "/"
        else:
            routing = ROUTING_INGRESS_NGINX
        results = {
            SESSION_DOMAIN_RESOLVES: check_session_domain(core_v1, session_domain=session_domain, ingress_node=ingress_node,
                                                          timeout=timeout),
            VERIFY_REACHABLE: check_verify(self.http, verify_url, timeout=timeout, routing=routing),
        }
        for name, result in results.items():
            before = self.results.get(name)
            if result is None:
                self.results.pop(name, None)
                continue
            if not result["ok"] and (before is None or before["detail"] != result["detail"]):
                logger.warning("session path check %s failed: %s", name, result["detail"])
            elif result["ok"] and before is not None and not before["ok"]:
                logger.info("session path check %s passes again: %s", name, result["detail"])
            self.results[name] = result
