"""The attach command's client of the control plane's public API (``/api/v1``), with a staff API token.

The attach runs wherever the operator's kubeconfig is (a laptop): it never opens the control plane's
database and never holds its signing key. Everything it asks of the control plane goes through the routes
below, the same ones any API client uses:

- ``GET /api/v1/version`` and ``GET /api/v1/me``: which release answers and whether the token is a staff token;
- ``GET /api/v1/clusters?name=``, ``POST /api/v1/clusters``, ``PATCH /api/v1/clusters/{id}``: registration;
- ``POST /api/v1/clusters/{id}/operator-token/push``: the control plane writes the operator's token into the
  cluster's Secret itself, so the token never passes through the laptop;
- ``POST /api/v1/clusters/{id}/connection-test`` and ``GET /api/v1/clusters/{id}``: the end of the attach.

HTTP is `requests` (already a dependency of the ``kubernetes`` client): sessions, timeouts and JSON decoding,
nothing of our own.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import requests

from gshare.version import GSHARE_VERSION

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

    Args:
        url: the control plane's base URL (``https://gshare.example.org``), without ``/api/v1``.
        token: an API token (``manage.py create_api_token``); sent as ``Authorization: Bearer``.
        timeout: seconds for each request (connect and read).
        long_timeout: seconds for requests that dial the cluster from the control plane (registration, the
            connection test, the token push): the control plane's own probe budget plus a margin.
    """

    def __init__(self, url: str, token: str, *, timeout: float = 15.0, long_timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.timeout, self.long_timeout = timeout, long_timeout
        self._http = requests.Session()
        self._http.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json",
                                   "User-Agent": f"gshare-attach/{GSHARE_VERSION}"})
        # Proxies from the environment would see the token; the control plane is dialled directly.
        self._http.trust_env = False

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ControlPlaneClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- transport

    def _call(self, method: str, path: str, *, body: dict | None = None, long: bool = False) -> Any:
        """One request; returns the decoded JSON answer of a 2xx.

        Raises:
            ControlPlaneError: no answer, a non-JSON answer (e.g. an HTML page: not gShare's API at that URL), or an
                error answer (``status``, ``code`` and ``detail`` from its body).
        """
        url = f"{self.url}/api/v1/{path}"
        try:
            response = self._http.request(method, url, json=body, timeout=self.long_timeout if long else self.timeout,
                                          allow_redirects=False, stream=True)
            raw = response.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
        except requests.exceptions.SSLError as exc:
            raise ControlPlaneError(f"TLS with {self.url} failed ({_reason(exc)})") from None
        except requests.exceptions.Timeout:
            raise ControlPlaneError(f"{self.url} did not answer within {self.long_timeout if long else self.timeout:g} s") from None
        except requests.exceptions.RequestException as exc:
            raise ControlPlaneError(f"{self.url} cannot be reached ({_reason(exc)})") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise ControlPlaneError(f"{url} answered more than {MAX_ANSWER_BYTES // 1024} KiB", status=response.status_code)
        if 300 <= response.status_code < 400:
            where = response.headers.get("Location", "")[:200]
            raise ControlPlaneError(f"{url} redirected to {where or 'another address'}: pass the address it redirects to",
                                    status=response.status_code)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        if answer is None and raw:
            kind = response.headers.get("Content-Type", "").split(";")[0] or "not JSON"
            raise ControlPlaneError(f"{url} answered HTTP {response.status_code} with {kind}, not gShare's API",
                                    status=response.status_code)
        if response.status_code >= 400:
            body = answer if isinstance(answer, dict) else {}
            raise ControlPlaneError(str(body.get("detail") or f"HTTP {response.status_code}")[:1000],
                                    status=response.status_code, code=str(body.get("code") or ""),
                                    extra={key: value for key, value in body.items() if key not in ("code", "detail")})
        return answer

    # ----------------------------------------------------------------- routes

    def version(self) -> dict:
        """``GET /api/v1/version``: ``{"version", "api", "operator_contract"}``."""
        return self._call("GET", "version")

    def me(self) -> dict:
        """``GET /api/v1/me``: ``{"username", "is_staff"}``."""
        return self._call("GET", "me")

    def cluster_named(self, name: str) -> dict | None:
        """The registered (not deregistered) cluster called ``name`` as staff see it, or None."""
        page = self._call("GET", f"clusters?{urllib.parse.urlencode({'name': name, 'limit': 50})}")
        rows = page.get("results", []) if isinstance(page, dict) else page
        return next((row for row in rows if row.get("name") == name and row.get("status") != "deregistered"), None)

    def cluster(self, cluster_id: str) -> dict:
        """``GET /api/v1/clusters/{id}``."""
        return self._call("GET", f"clusters/{urllib.parse.quote(cluster_id)}")

    def register(self, fields: dict) -> dict:
        """``POST /api/v1/clusters`` (the control plane probes the cluster first)."""
        return self._call("POST", "clusters", body=fields, long=True)

    def update(self, cluster_id: str, changes: dict) -> dict:
        """``PATCH /api/v1/clusters/{id}`` (a kubeconfig is probed and must reach the same cluster)."""
        return self._call("PATCH", f"clusters/{urllib.parse.quote(cluster_id)}", body=changes, long=True)

    def operator_token_push(self, cluster_id: str) -> dict:
        """``POST /api/v1/clusters/{id}/operator-token/push``: ``{"secret", "secret_action", "expires_at", ...}``."""
        return self._call("POST", f"clusters/{urllib.parse.quote(cluster_id)}/operator-token/push", long=True)

    def connection_test(self, cluster_id: str) -> dict:
        """``POST /api/v1/clusters/{id}/connection-test``: ``{"status", "checks", "detail", ...}``."""
        return self._call("POST", f"clusters/{urllib.parse.quote(cluster_id)}/connection-test", long=True)


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
