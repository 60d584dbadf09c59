"""The demo's Envoy Gateway: what an Envoy proxy configured by Envoy Gateway v1.9.0 does for gShare's session
``HTTPRoute``, ``SecurityPolicy`` (``extAuth.http``) and ``Backend``, for the demo ingress (``demo.ingress_nginx``).

A cluster in ``gateway-api`` routing mode has, per session, an ``HTTPRoute`` (``gateway.networking.k8s.io/v1``) on the
cluster's Gateway, and a ``SecurityPolicy`` targeting it whose HTTP ext_authz service is a ``Backend``
(``gateway.envoyproxy.io/v1alpha1``) pointing at the control plane. ``demo.ingress_nginx`` lists them from each emulated
apiserver (``GatewayTable.list``) next to the Ingresses; a host some HTTPRoute names is served here, any other host
the ingress-nginx way (a cluster is in one mode at a time).

What it does, after Envoy Gateway v1.9.0 and Envoy:

* **path normalisation** (``envoy_path``), as Envoy Gateway configures Envoy's HTTP connection manager
  (``internal/gatewayapi/listener.go``: ``MergeSlashes: true``, ``EscapedSlashesAction: UnescapeAndRedirect``;
  ``internal/xds/translator/listener.go``: ``normalize_path: true``) and in the order of Envoy's
  ``ConnectionManagerUtility::maybeNormalizePath``: ``%2F``/``%5C`` (any case) in the path are unescaped and the
  client is redirected there (``307``, ``Location`` = the normalised path and query); RFC 3986 normalisation
  (``PathUtil::canonicalPath``, Chromium's path canonicaliser: ``..;params``/``.;params`` are dot segments,
  percent-encoded unreserved characters decoded, other escapes kept as sent, ``%00`` refused, ``\\`` a slash, characters
  that must be escaped escaped, ``.``/``..`` segments resolved, never above ``/``; Envoy's ``path_utility_test.cc``
  cases); then ``//`` merged. The query is left as sent. A request target that is not an origin-form path, or one
  with a ``#`` fragment, is a ``400``;
* **routing** (``GatewayTable.route``): an HTTPRoute attached (``parentRefs``) to a Gateway that exists and has an
  ``HTTP`` or ``HTTPS`` listener (TLS is not terminated here: the demo's ingress is plain HTTP, as for Ingresses) whose
  ``hostname`` (if any) and ``allowedRoutes.namespaces.from`` (``Same``, default, ``All``, or ``Selector`` by
  ``matchLabels`` on ``kubernetes.io/metadata.name``, the label the apiserver puts on every namespace, as
  ``attach_cluster``'s Gateway uses it; other selectors admit nothing here) admit it; ``hostnames`` exact or ``*.`` wildcard (the request's ``Host``
  name, port dropped, lower-case); ``PathPrefix`` matches as the Gateway API specifies (element-wise: ``/s/a`` and
  ``/s/a/`` both match ``/s/a`` and ``/s/a/x`` but not ``/s/ab``), ``Exact`` exactly; the longest match wins
  (Envoy Gateway sorts routes so); nothing matching is Envoy's ``404`` with an empty body. ``RegularExpression`` and
  header/query/method matches are not served (such a match never matches);
* **ext_authz** (``ext_authz_check``): for a route targeted by a ``SecurityPolicy`` with ``extAuth.http``, the check
  Envoy's HTTP ext_authz client sends (``source/extensions/filters/common/ext_authz/ext_authz_http_impl.cc``,
  ``RawHttpClientImpl::check`` and ``ClientConfig::toRequestMatchers``), as Envoy Gateway configures it
  (``internal/xds/translator/extauth.go``: ``headersToExtAuth`` -> ``allowed_headers``, ``path`` -> ``path_prefix``,
  ``headersToBackend`` -> ``allowed_upstream_headers``, 10 s timeout): to the ``Backend``'s first endpoint (``fqdn``
  or ``ip``, plain HTTP), the ORIGINAL method, ``:path`` = ``extAuth.http.path`` + the normalised path and query,
  ``Host`` = the request's authority, ``Content-Length: 0``, no body, and only the headers Envoy always sends
  (``Authorization``) plus ``headersToExtAuth`` (``X-Forwarded-Proto`` being the connection's scheme, set by Envoy at
  the edge, never the client's). A ``200`` lets the request through with the answer's ``headersToBackend`` (the
  client's own copies of those headers are dropped first: stricter than Envoy, which leaves a client's copy when the
  answer lacks the header); any other status below 500 is sent to the client as Envoy sends a denial: that status,
  every header of the check's answer but ``Host`` (``allowed_client_headers`` unset: ``Set-Cookie``, ``Location``
  ...) and its body; a ``5xx`` answer or none (refused, reset, time-out) is Envoy's error case, ``403``
  (``failOpen: false``, no ``statusOnError``), and an allowed answer's ``Set-Cookie`` never reaches the client; a
  route whose SecurityPolicy's check cannot be built (no Backend, no endpoint) answers ``500``, as Envoy Gateway
  makes it (never unchecked);
* **the backend**: the ``backendRefs`` Service's session page (``demo.session_page``, through the caller's
  ``backend``); no Running pod is Envoy's ``503`` ``no healthy upstream``.
"""

from __future__ import annotations

import http.client
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

logger = logging.getLogger("demo.envoy_proxy")

GATEWAY_GROUP = "gateway.networking.k8s.io"
ENVOY_GROUP = "gateway.envoyproxy.io"
HTTPROUTES = "/apis/gateway.networking.k8s.io/v1/httproutes"
GATEWAYS = "/apis/gateway.networking.k8s.io/v1/gateways"
SECURITY_POLICIES = "/apis/gateway.envoyproxy.io/v1alpha1/securitypolicies"
BACKENDS = "/apis/gateway.envoyproxy.io/v1alpha1/backends"
#: Envoy Gateway's default ext_authz timeout (``extAuth.timeout`` unset), seconds.
EXT_AUTH_TIMEOUT = 10.0
#: Headers Envoy's HTTP ext_authz client always sends besides ``:method``, ``:path``, ``:authority`` and
#: ``Content-Length`` (``ext_authz_http_impl.cc``: the default request header matchers).
ALWAYS_TO_EXT_AUTH = ("authorization",)
_ESCAPED_SLASH = re.compile(r"%(2f|5c)", re.IGNORECASE)
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# what Chromium's path canonicaliser passes unchanged besides unreserved characters, "%" and "\\" (RFC 3986 pchar and
# "/"); the rest (space, '"', "<", ">", "`", "{", "}", controls, non-ASCII) is percent-encoded
_PASSED = frozenset("/!$&'()*+,;=:@[]|^")
_DOT_PARAMETERS = re.compile(r"(?<=/)(\.\.?);[^/]*")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "content-length", "host"}

#: ``get(path) -> JSON dict`` on one emulated apiserver (``demo.ingress_nginx.ClusterApi.get``), None on 404.
Getter = Callable[[str], "dict[str, Any] | None"]
#: What an answer is: ``(status, [(header, value)...], body)``.
Reply = tuple[int, list[tuple[str, str]], bytes]


@dataclass(frozen=True)
class EnvoyPath:
    """A request target as Envoy routes it (``envoy_path``).

    Attributes:
        path: the normalised path (no query). query: the query string as sent ("" when none).
        redirect: escaped slashes were unescaped: Envoy answers ``307`` to ``path_and_query``.
    """

    path: str
    query: str
    redirect: bool

    @property
    def path_and_query(self) -> str:
        """``path?query`` (``path`` alone without a query)."""
        return f"{self.path}?{self.query}" if self.query else self.path


def _canonical_path(path: str) -> str | None:
    """Envoy's ``PathUtil::canonicalPath`` (see the module docstring); None when it refuses the path (a ``%00``)."""
    # envoy.reloadable_features.strip_dotdot_segments_with_parameters (on): "..;p" and ".;p" are dot segments
    path = _DOT_PARAMETERS.sub(lambda m: m.group(1), path)
    out: list[str] = []
    i = 0
    while i < len(path):
        char = path[i]
        if char == "%":
            pair = path[i + 1:i + 3]
            if len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair):
                decoded = chr(int(pair, 16))
                if decoded == "\x00":
                    return None  # Chromium's INVALID_BIT: the canonicaliser fails and Envoy answers 400
                # unreserved characters are decoded; other escapes are kept as sent (their case too)
                out.append(decoded if decoded in _UNRESERVED else f"%{pair}")
                i += 3
                continue
            out.append("%")  # an invalid escape: the percent is copied as it is
        elif char == "\\":
            out.append("/")  # Chromium's path canonicaliser: a backslash is a slash
        elif char in _UNRESERVED or char in _PASSED:
            out.append(char)
        else:
            out.append(quote(char, safe=""))
        i += 1
    segments: list[str] = []
    parts = "".join(out).split("/")[1:]
    for index, segment in enumerate(parts):
        last = index == len(parts) - 1
        if segment == ".":
            if last:
                segments.append("")
        elif segment == "..":
            if segments:
                segments.pop()
            if last:
                segments.append("")
        else:
            segments.append(segment)
    return "/" + "/".join(segments)


def envoy_path(request_target: str) -> EnvoyPath | None:
    """The path Envoy routes a request target on (see the module docstring), None when Envoy refuses it (``400``)."""
    if "#" in request_target or not request_target.startswith("/"):
        return None
    path, _, query = request_target.partition("?")
    redirect = bool(_ESCAPED_SLASH.search(path))
    if redirect:
        path = _ESCAPED_SLASH.sub(lambda m: "/" if m.group(1).lower() == "2f" else "\\", path)
    canonical = _canonical_path(path)
    if canonical is None:
        return None
    return EnvoyPath(re.sub(r"/{2,}", "/", canonical), query, redirect)


@dataclass(frozen=True)
class ExtAuth:
    """A ``SecurityPolicy``'s ``extAuth.http`` with its ``Backend`` resolved (Envoy Gateway v1.9.0 SecurityPolicy).

    Attributes:
        host: the Backend endpoint's ``fqdn.hostname`` or ``ip.address``; port: its port.
        path: ``extAuth.http.path`` (prefix of the check's path). headers_to_ext_auth / headers_to_backend: lower-case
        header names.
    """

    host: str
    port: int
    path: str
    headers_to_ext_auth: tuple[str, ...]
    headers_to_backend: tuple[str, ...]


@dataclass(frozen=True)
class GatewayRoute:
    """One ``HTTPRoute`` rule match: where it sends requests and who checks them.

    Attributes:
        namespace / route: the HTTPRoute. hostnames: its ``hostnames`` (lower-case; empty: the listener's).
        match_type: ``PathPrefix`` or ``Exact``; value: the path value (a prefix without its trailing ``/``, ``""`` for
        ``/``). service / port: the first ``backendRefs`` Service. auth: the SecurityPolicy's check, or None.
        auth_broken: a SecurityPolicy targets the route but its ``extAuth`` cannot be built (no ``http``, no Backend
        with an endpoint): Envoy Gateway then answers the route with a ``500`` direct response rather than let
        requests through unchecked (``internal/gatewayapi/securitypolicy.go``, ``failOpen`` false).
    """

    namespace: str
    route: str
    hostnames: tuple[str, ...]
    match_type: str
    value: str
    service: str
    port: int | None
    auth: ExtAuth | None
    auth_broken: bool = False
    #: ``(host, port)`` of an Envoy Gateway ``Backend`` the rule sends to (the cluster's fallback route for ``/s/`` to
    #: the control plane) instead of a Service, else None.
    upstream: tuple[str, int] | None = None

    def matches(self, path: str) -> bool:
        """Whether the normalised ``path`` matches (Gateway API path semantics, case-sensitive)."""
        if self.match_type == "Exact":
            return path == self.value
        return self.value == "" or path == self.value or path.startswith(self.value + "/")

    @property
    def length(self) -> int:
        """How specific the match is (the longest wins; an exact match before a prefix of the same length)."""
        return len(self.value) * 2 + (1 if self.match_type == "Exact" else 0)


def _host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return pattern == host


def _items(listed: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [i for i in ((listed or {}).get("items") or []) if isinstance(i, dict)]


def _meta(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _listeners(gateways: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """HTTP and HTTPS listeners of each Gateway, by ``(namespace, name)``."""
    return {_meta(g): [listener for listener in (g.get("spec") or {}).get("listeners") or []
                       if isinstance(listener, dict) and listener.get("protocol") in ("HTTP", "HTTPS")]
            for g in gateways if not (g.get("metadata") or {}).get("deletionTimestamp")}


def _namespace_admitted(listener: Mapping[str, Any], gateway_namespace: str, route_namespace: str) -> bool:
    """Whether ``allowedRoutes.namespaces`` of ``listener`` admits a route of ``route_namespace`` (Gateway API v1:
    ``Same`` by default, ``All``, ``Selector``; a selector is judged only on ``kubernetes.io/metadata.name``)."""
    namespaces = (listener.get("allowedRoutes") or {}).get("namespaces") or {}
    allowed = namespaces.get("from") or "Same"
    if allowed == "Selector":
        selector = namespaces.get("selector") or {}
        labels = selector.get("matchLabels") or {}
        return not selector.get("matchExpressions") and labels == {"kubernetes.io/metadata.name": route_namespace}
    return allowed == "All" or (allowed == "Same" and gateway_namespace == route_namespace)


def _admitted_hosts(route: Mapping[str, Any], listeners: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    """The host patterns the route serves on the Gateways it attaches to (``[]``: not attached)."""
    namespace, _ = _meta(route)
    spec = route.get("spec") or {}
    hostnames = [str(h).lower() for h in spec.get("hostnames") or []]
    admitted: list[str] = []
    for ref in spec.get("parentRefs") or []:
        if (ref.get("group") or GATEWAY_GROUP, ref.get("kind") or "Gateway") != (GATEWAY_GROUP, "Gateway"):
            continue
        gateway = (ref.get("namespace") or namespace, ref.get("name") or "")
        for listener in listeners.get(gateway, []):
            if ref.get("sectionName") and ref["sectionName"] != listener.get("name"):
                continue
            if not _namespace_admitted(listener, gateway[0], namespace):
                continue
            on_listener = (listener.get("hostname") or "").lower()
            if not on_listener:
                admitted += hostnames or ["*"]
            elif not hostnames:
                admitted.append(on_listener)
            else:  # the intersection: the more specific of the two
                admitted += [h for h in hostnames if h == on_listener or _host_matches(on_listener, h)]
                admitted += [on_listener for h in hostnames if _host_matches(h, on_listener)]
    return admitted


def _endpoint(backend: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """``(host, port)`` of a ``Backend``'s first ``fqdn`` or ``ip`` endpoint, None without one."""
    for endpoint in ((backend or {}).get("spec") or {}).get("endpoints") or []:
        for kind, key in (("fqdn", "hostname"), ("ip", "address")):
            target = endpoint.get(kind) or {}
            if target.get(key) and target.get("port"):
                return str(target[key]), int(target["port"])
    return None


def _ext_auth(policy: Mapping[str, Any], backends: dict[tuple[str, str], dict[str, Any]]) -> ExtAuth | None:
    """The check of a SecurityPolicy's ``extAuth.http``, None when it has none or its Backend has no endpoint."""
    namespace, _ = _meta(policy)
    ext = (policy.get("spec") or {}).get("extAuth") or {}
    http_auth = ext.get("http") or {}
    refs = http_auth.get("backendRefs") or ([http_auth["backendRef"]] if http_auth.get("backendRef") else [])
    for ref in refs:
        if (ref.get("group"), ref.get("kind")) != (ENVOY_GROUP, "Backend"):
            continue
        backend = backends.get((ref.get("namespace") or namespace, ref.get("name") or ""))
        for endpoint in ((backend or {}).get("spec") or {}).get("endpoints") or []:
            address = endpoint.get("fqdn") or {}
            host = address.get("hostname")
            if not host:
                address = endpoint.get("ip") or {}
                host = address.get("address")
            if host and address.get("port"):
                return ExtAuth(host=str(host), port=int(address["port"]), path=str(http_auth.get("path") or ""),
                               headers_to_ext_auth=tuple(str(h).lower() for h in ext.get("headersToExtAuth") or []),
                               headers_to_backend=tuple(str(h).lower() for h in http_auth.get("headersToBackend") or []))
    return None


@dataclass
class GatewayTable:
    """The routes of one cluster's HTTPRoutes, by host pattern (``*`` for a listener and route without hostnames)."""

    routes: dict[str, list[GatewayRoute]] = field(default_factory=dict)

    @classmethod
    def list(cls, get: Getter) -> GatewayTable:
        """List the cluster's Gateways, HTTPRoutes, SecurityPolicies and Backends (a ``404``, no such CRD, is none).

        Raises:
            requests.RequestException, ValueError: as ``get`` does.
        """
        gateways = get(GATEWAYS)
        if gateways is None:  # no Gateway API on the cluster: nothing else to list
            return cls()
        return cls.build(_items(gateways), *(_items(get(path)) for path in (HTTPROUTES, SECURITY_POLICIES, BACKENDS)))

    @classmethod
    def build(cls, gateways: list[dict[str, Any]], routes: list[dict[str, Any]], policies: list[dict[str, Any]],
              backends: list[dict[str, Any]]) -> GatewayTable:
        """The table of these objects (see the module docstring for what attaches and what is checked)."""
        listeners = _listeners(gateways)
        by_name = {_meta(b): b for b in backends}
        checks: dict[tuple[str, str], ExtAuth | None] = {}  # None: a policy targets the route, its check is broken
        for policy in policies:
            if (policy.get("metadata") or {}).get("deletionTimestamp"):
                continue
            auth = _ext_auth(policy, by_name)
            namespace, _ = _meta(policy)
            for ref in (policy.get("spec") or {}).get("targetRefs") or []:
                if (ref.get("group"), ref.get("kind")) == (GATEWAY_GROUP, "HTTPRoute"):
                    key = (namespace, ref.get("name") or "")
                    if checks.get(key) is None:
                        checks[key] = auth
        table = cls()
        for route in routes:
            if (route.get("metadata") or {}).get("deletionTimestamp"):
                continue
            namespace, name = _meta(route)
            hosts = _admitted_hosts(route, listeners)
            for rule in (route.get("spec") or {}).get("rules") or []:
                backend = next((b for b in rule.get("backendRefs") or []
                                if (b.get("group") or "", b.get("kind") or "Service") in (("", "Service"), (ENVOY_GROUP, "Backend"))),
                               None)
                if backend is None:
                    continue
                upstream = None
                if backend.get("kind") == "Backend":
                    upstream = _endpoint(by_name.get((namespace, backend.get("name") or "")))
                    if upstream is None:
                        continue  # Envoy Gateway: a backendRef it cannot resolve gets no route (a 500 for the rule)
                for match in rule.get("matches") or [{"path": {"type": "PathPrefix", "value": "/"}}]:
                    path = match.get("path") or {"type": "PathPrefix", "value": "/"}
                    kind, value = path.get("type") or "PathPrefix", path.get("value") or "/"
                    if kind not in ("PathPrefix", "Exact") or set(match) - {"path"}:
                        continue
                    entry = GatewayRoute(namespace, name, tuple(hosts), kind,
                                         value.rstrip("/") if kind == "PathPrefix" else value, backend.get("name", ""),
                                         backend.get("port"), checks.get((namespace, name)),
                                         auth_broken=(namespace, name) in checks and checks[(namespace, name)] is None,
                                         upstream=upstream)
                    for host in hosts:
                        table.routes.setdefault(host, []).append(entry)
        return table

    def serves(self, host: str) -> bool:
        """Whether some HTTPRoute serves ``host`` (the cluster then answers it the Envoy Gateway way)."""
        return any(_host_matches(pattern, host) or pattern == "*" for pattern in self.routes)

    def route(self, host: str, path: str) -> GatewayRoute | None:
        """The route serving the normalised ``path`` on ``host``: the longest match; exact host patterns first."""
        for patterns in ([host], sorted((p for p in self.routes if p.startswith("*.") and _host_matches(p, host)),
                                        key=len, reverse=True), ["*"]):
            found = [r for p in patterns for r in self.routes.get(p, []) if r.matches(path)]
            if found:
                return max(found, key=lambda r: r.length)
        return None


def ext_authz_check(auth: ExtAuth, *, method: str, authority: str, path_and_query: str,
                    headers: list[tuple[str, str]]) -> Reply | None:
    """The check request of Envoy's HTTP ext_authz (see the module docstring) and its answer.

    Args:
        auth: the check. method: the request's method. authority: its ``Host`` (validated ``name[:port]``).
        path_and_query: the normalised path and the query. headers: the client's headers.

    Returns:
        ``(status, headers, body)`` of the authorization service, None when it could not be reached or answered
        nothing usable (Envoy's error case).
    """
    wanted = set(ALWAYS_TO_EXT_AUTH) | set(auth.headers_to_ext_auth)
    sent = [(name, value) for name, value in headers if name.lower() in wanted and name.lower() not in _HOP_BY_HOP]
    connection = http.client.HTTPConnection(auth.host, auth.port, timeout=EXT_AUTH_TIMEOUT)
    try:
        connection.putrequest(method, auth.path + path_and_query, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", authority)
        for name, value in sent:
            connection.putheader(name, value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        return response.status, response.getheaders(), body
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a header http.client refuses
        logger.warning("ext_authz check to %s:%s failed: %s", auth.host, auth.port, type(exc).__name__)
        return None
    finally:
        connection.close()


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return next((value for key, value in headers if key.lower() == name), "")


def _edge_headers(headers: list[tuple[str, str]], client_ip: str) -> list[tuple[str, str]]:
    """The client's headers as Envoy's connection manager passes them on at the edge (Envoy Gateway's default
    ``use_remote_address: true``, no trusted hops): ``X-Forwarded-Proto`` is the connection's scheme (``http`` here),
    whatever the client sent, and the client's address is appended to ``X-Forwarded-For``."""
    forwarded = ", ".join([v for k, v in headers if k.lower() == "x-forwarded-for"] + [client_ip])
    kept = [(k, v) for k, v in headers if k.lower() not in ("x-forwarded-proto", "x-forwarded-for")]
    return [*kept, ("X-Forwarded-Proto", "http"), ("X-Forwarded-For", forwarded)]


def handle(table: GatewayTable, *, method: str, authority: str, hostname: str, request_target: str,
           headers: list[tuple[str, str]], client_ip: str,
           backend: Callable[[GatewayRoute, str, dict[str, str]], Reply]) -> Reply:
    """Answer one request as Envoy configured by Envoy Gateway would (see the module docstring).

    Args:
        table: the cluster's routes. method: the request's method. authority: its ``Host`` header (validated).
        hostname: the Host's name (lower-case, no port). request_target: the request-target as sent. headers: the
        client's headers. client_ip: the client's address.
        backend: ``(route, normalised path, headers for the backend) -> reply`` of the route's Service.
    """
    target = envoy_path(request_target)
    if target is None:
        return 400, [("Content-Type", "text/plain")], b"Bad Request"
    if target.redirect:
        return 307, [("Location", target.path_and_query)], b""
    route = table.route(hostname, target.path)
    if route is None:
        return 404, [], b""
    if route.auth_broken:
        return 500, [], b""
    headers = _edge_headers(headers, client_ip)
    upstream = {k.lower(): v for k, v in headers if k.lower() not in _HOP_BY_HOP}
    if route.auth is not None:
        verdict = ext_authz_check(route.auth, method=method, authority=authority,
                                  path_and_query=target.path_and_query, headers=headers)
        if verdict is None:
            return 403, [], b""
        status, answer_headers, body = verdict
        if status >= 500:  # RawHttpClientImpl::toResponse: a 5xx is an error, answered with status_on_error
            return 403, [], b""
        if status != 200:
            # Envoy's own Server and Date replace the check's (server_header_transformation: OVERWRITE)
            kept = [(k, v) for k, v in answer_headers if k.lower() not in _HOP_BY_HOP | {"server", "date"}]
            return status, kept, body
        for name in route.auth.headers_to_backend:
            upstream.pop(name, None)
            if _header(answer_headers, name):
                upstream[name] = _header(answer_headers, name)
    return backend(route, target.path, upstream)


__all__ = ["ALWAYS_TO_EXT_AUTH", "EXT_AUTH_TIMEOUT", "EnvoyPath", "ExtAuth", "GatewayRoute", "GatewayTable",
           "envoy_path", "ext_authz_check", "handle"]
