"""The attach command's client of the control plane's public API (``/api/v1``), with a staff API token.

The attach runs wherever the operator's kubeconfig is (a laptop): it never opens the control plane's
database and never holds its signing key. Everything it asks of the control plane goes through the routes
below, the same ones any API client uses:

- ``GET /api/v1/version`` and ``GET /api/v1/me``: which release answers and whether the token is a staff token;
- ``GET /api/v1/clusters?name=``, ``POST /api/v1/clusters``, ``PATCH /api/v1/clusters/{id}``: registration;
- ``POST /api/v1/clusters/{id}/operator-token/push``: the control plane writes the operator's token into the
  cluster's Secret itself, so the token never passes through the laptop;
- ``POST /api/v1/clusters/{id}/connection-test`` and ``GET /api/v1/clusters/{id}``: the end of the attach.

HTTP is `requests` (already a dependency of the ``kubernetes`` client): sessions, timeouts and JSON decoding; each call
is bounded as a whole by ``kube.Deadline`` (the one the apiserver calls use).
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from typing import Any

import requests
import requests.adapters

from core.version import GSHARE_VERSION
from kube import Deadline, DeadlineExceeded, guard_pools

#: C0 and C1 control characters but tab and newline: a server's text is printed to the user's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: Pages of 50 clusters read when looking a name up (deregistered clusters of that name come first or between).
MAX_NAME_PAGES = 20
#: Largest answer read from the control plane (a cluster with its last connection test is a few KiB).
MAX_ANSWER_BYTES = 1024 * 1024


class ControlPlaneError(Exception):
    """The control plane did not answer as its API does.

    Attributes:
        status: HTTP status (0 when no HTTP answer came: DNS, refused, TLS, timeout, not gShare's JSON).
        code: the error body's ``code`` (``not_authenticated``, ``cluster_unreachable``, ...), or "".
        detail: the error body's ``detail`` sentence, or what went wrong on the way.
        extra: the error body's other fields (``cluster``, ``sessions``, ...).
    """

    def __init__(self, detail: str, *, status: int = 0, code: str = "", extra: dict | None = None):
        super().__init__(detail)
        self.detail, self.status, self.code, self.extra = detail, status, code, extra or {}


class ControlPlaneClient:
    """A staff token's session with the control plane's public API.

    Every call is bounded as a whole (connecting, the headers and the body), not only each read: a server that
    trickles its answer a byte at a time is cut off when the call's time is spent. Redirects are not followed
    (the token would go with them). The token never appears in an error: an error body or a ``Location`` that
    echoes it is shown with ``<token>`` instead.

    Args:
        url: the control plane's base URL (``https://gshare.example.org``), without ``/api/v1``. Its certificate is
            verified against ``REQUESTS_CA_BUNDLE`` or ``SSL_CERT_FILE`` when set (a private CA), else certifi's CAs.
        token: an API token (``manage.py create_api_token``); sent as ``Authorization: Bearer``.
        timeout: seconds for each request, in all.
        long_timeout: seconds for requests that dial the cluster from the control plane (registration, the
            connection test, the token push): the control plane's own probe budget plus a margin.
    """

    def __init__(self, url: str, token: str, *, timeout: float = 15.0, long_timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.timeout, self.long_timeout = timeout, long_timeout
        # The whole token, and its secret part alone (``gsh_<key id>_<secret>``), are scrubbed from what is shown.
        self._secrets = tuple(sorted({part for part in (token, token.split("_", 2)[-1]) if len(part) >= 8}, key=len, reverse=True))
        self._http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(max_retries=0)
        guard_pools(adapter.poolmanager)  # so that Deadline.call can cut a trickling answer off
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)
        # One connection per call (asked for here, and the pool is emptied after each call in _fetch): the attach's calls
        # are minutes apart (Helm installs between them), and a kept-alive connection the server closes as it is
        # reused fails the call (urllib3 retries are off).
        self._http.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json",
                                   "User-Agent": f"gshare-attach/{GSHARE_VERSION}", "Connection": "close"})
        # Proxies from the environment would see the token, and a .netrc would replace it: the control plane is dialled
        # directly. That also drops requests' own CA variables, so a private CA is taken from them here.
        self._http.trust_env = False
        self._http.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE") or True

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ControlPlaneClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- transport

    def _redact(self, value: Any) -> Any:
        """``value`` (text, or the lists and objects of a JSON body) with the token replaced by ``<token>`` and control
        characters (a terminal's escape sequences: the text is printed) by ``?``."""
        if isinstance(value, str):
            for secret in self._secrets:
                value = value.replace(secret, "<token>")
            return _CONTROL.sub("?", value)
        if isinstance(value, dict):
            return {self._redact(str(key)): self._redact(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._redact(item) for item in value]
        return value

    def _fetch(self, method: str, url: str, body: dict | None, *, _request_timeout: tuple[float, float]) -> tuple[int, dict, bytes]:
        """``(status, headers, at most MAX_ANSWER_BYTES + 1 bytes of the decoded body)`` of one request."""
        try:
            with self._http.request(method, url, json=body, timeout=_request_timeout, allow_redirects=False, stream=True) as response:
                raw = bytearray()
                for chunk in response.iter_content(64 * 1024):
                    raw += chunk
                    if len(raw) > MAX_ANSWER_BYTES:
                        break
                return response.status_code, dict(response.headers), bytes(raw)
        finally:
            self._http.close()  # the pools are made again on the next call, their connections still guarded

    def _call(self, method: str, path: str, *, body: dict | None = None, long: bool = False) -> Any:
        """One request; returns the decoded JSON answer of a 2xx (anything JSON but ``null``).

        Raises:
            ControlPlaneError: no answer within the call's time, a non-JSON answer (e.g. an HTML page: not gShare's
                API at that URL), a redirect, or an error answer (``status``, ``code`` and ``detail`` from its body).
        """
        url = f"{self.url}/api/v1/{path}"
        seconds = self.long_timeout if long else self.timeout
        try:
            status, headers, raw = Deadline(seconds).call(self._fetch, method, url, body)
        except (DeadlineExceeded, requests.exceptions.Timeout):
            raise ControlPlaneError(f"{self.url} did not answer within {seconds:g} s") from None
        except requests.exceptions.SSLError as exc:
            raise ControlPlaneError(f"TLS with {self.url} failed ({_reason(exc)})") from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise ControlPlaneError(f"{self.url} cannot be reached ({_reason(exc)})") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise ControlPlaneError(f"{url} answered more than {MAX_ANSWER_BYTES // 1024} KiB", status=status)
        if 300 <= status < 400:
            where = self._redact(headers.get("Location", ""))[:200]
            raise ControlPlaneError(f"{url} redirected to {where or 'another address'}: pass the address it redirects to",
                                    status=status)
        try:
            answer = json.loads(raw, parse_constant=_not_json) if raw else None
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack (``[[[[...``)
            answer = None
        if answer is None and raw:
            kind = headers.get("Content-Type", "").split(";")[0] or "not JSON"
            raise ControlPlaneError(f"{url} answered HTTP {status} with {kind}, not gShare's API", status=status)
        if status >= 400:
            error = self._redact(answer) if isinstance(answer, dict) else {}
            raise ControlPlaneError(str(error.get("detail") or f"HTTP {status}")[:1000],
                                    status=status, code=str(error.get("code") or "")[:100],
                                    extra={key: value for key, value in error.items() if key not in ("code", "detail")})
        return answer

    def _object(self, method: str, path: str, **kwargs) -> dict:
        """:meth:`_call` for a route that answers a JSON object."""
        answer = self._call(method, path, **kwargs)
        if not isinstance(answer, dict):
            raise ControlPlaneError(f"{self.url}/api/v1/{path} answered {_kind(answer)}, not gShare's API (a JSON object)")
        return answer

    def _cluster(self, method: str, path: str, **kwargs) -> dict:
        """:meth:`_object` for a route that answers a cluster (at least its ``id`` and ``name``)."""
        return _checked_cluster(self._object(method, path, **kwargs), f"{self.url}/api/v1/{path}")

    # ----------------------------------------------------------------- routes

    def version(self) -> dict:
        """``GET /api/v1/version``: ``{"version", "api", "operator_contract"}``."""
        return self._object("GET", "version")

    def me(self) -> dict:
        """``GET /api/v1/me``: ``{"username", "is_staff"}``."""
        return self._object("GET", "me")

    def cluster_named(self, name: str) -> dict | None:
        """The registered (not deregistered) cluster called ``name`` as staff see it, or None.

        Deregistered clusters keep their name, so the list is read page by page (at most ``MAX_NAME_PAGES`` pages of
        50) until the registered one shows up.
        """
        for page in range(MAX_NAME_PAGES):
            path = f"clusters?{urllib.parse.urlencode({'name': name, 'limit': 50, 'offset': page * 50})}"
            rows = self._object("GET", path).get("results")
            if not isinstance(rows, list):
                raise ControlPlaneError(f"{self.url}/api/v1/{path} answered without a list of results, not gShare's API")
            rows = [_checked_cluster(row, f"{self.url}/api/v1/{path}") for row in rows]
            found = next((row for row in rows if row["name"] == name and row.get("status") != "deregistered"), None)
            if found is not None or len(rows) < 50:
                return found
        return None

    def cluster(self, cluster_id: str) -> dict:
        """``GET /api/v1/clusters/{id}``."""
        return self._cluster("GET", f"clusters/{urllib.parse.quote(cluster_id, safe='')}")

    def register(self, fields: dict) -> dict:
        """``POST /api/v1/clusters`` (the control plane probes the cluster first)."""
        return self._cluster("POST", "clusters", body=fields, long=True)

    def update(self, cluster_id: str, changes: dict) -> dict:
        """``PATCH /api/v1/clusters/{id}`` (a kubeconfig is probed and must reach the same cluster)."""
        return self._cluster("PATCH", f"clusters/{urllib.parse.quote(cluster_id, safe='')}", body=changes, long=True)

    def operator_token_push(self, cluster_id: str) -> dict:
        """``POST /api/v1/clusters/{id}/operator-token/push``: ``{"secret", "secret_action", "expires_at", ...}``."""
        return self._object("POST", f"clusters/{urllib.parse.quote(cluster_id, safe='')}/operator-token/push", long=True)

    def connection_test(self, cluster_id: str) -> dict:
        """``POST /api/v1/clusters/{id}/connection-test``: ``{"status", "checks", "detail", ...}``."""
        return self._object("POST", f"clusters/{urllib.parse.quote(cluster_id, safe='')}/connection-test", long=True)


def _not_json(constant: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259), though Python's decoder takes them."""
    raise ValueError(f"{constant} is not JSON")


def _kind(value: Any) -> str:
    """``a JSON list``, ``a JSON string``, ... for an answer of the wrong shape."""
    return {list: "a JSON list", str: "a JSON string", bool: "a JSON boolean", int: "a JSON number",
            float: "a JSON number"}.get(type(value), "nothing")


def _checked_cluster(row: Any, where: str) -> dict:
    """``row`` when it is a cluster object with a string ``id`` and ``name``; else :class:`ControlPlaneError`."""
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("name"), str) or not row["id"]:
        raise ControlPlaneError(f"{where} answered a cluster without its id and name, not gShare's API")
    return row


def _reason(exc: Exception) -> str:
    """The innermost cause of a requests error, in a few words (``ConnectionRefusedError``, a DNS failure, ...)."""
    inner: BaseException = exc
    while True:
        nested = inner.__context__ or inner.__cause__ or (inner.args[0] if inner.args and isinstance(inner.args[0], BaseException) else None)
        if nested is None or nested is inner:
            break
        inner = nested
    text = str(inner)
    if "Name or service not known" in text or "nodename nor servname" in text or "Temporary failure in name resolution" in text:
        return "its hostname does not resolve"
    if isinstance(inner, ConnectionRefusedError) or "Connection refused" in text:
        return "connection refused"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "its certificate does not verify"
    return type(inner).__name__
