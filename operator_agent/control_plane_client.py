"""HTTP client for the control plane's operator routes (``/internal/v1/…``).

Every request carries ``Authorization: Bearer <operator token>``. The token is chosen before
*every* attempt, retries included, by ``operator_agent.token.TokenSource``: the newest of the
token file (``OperatorConfig.token_file``, re-read each time), the token Secret read through the
Kubernetes API (when configured) and a self-refreshed token in memory; so a rotated Secret is
picked up without a restart. The token is never logged.

Failure handling:

* connection errors, timeouts, 5xx and 429: retried with capped exponential backoff and
  jitter (base 1 s, doubling, cap ``OperatorConfig.backoff_max``; a ``Retry-After`` in
  seconds is honoured up to the cap), at most ``max_attempts`` attempts, then
  ``ControlPlaneUnavailable``. The caller's next tick sends a fresh request anyway.
* 401: the token is expired, revoked or belongs to a deregistered cluster. If another token is
  available (e.g. the Secret now holds a newer one), it is tried at once; otherwise logged as
  ``operator token expired or revoked: rotate it …`` with the body's ``detail`` and not retried
  (``ControlPlaneAuthError``).
* 403 and other 4xx: logged with the body's ``code`` and ``detail``; not retried
  (``ControlPlaneRejected``).
* a token that a header cannot carry (a line break inside it): ``TokenUnavailable`` before anything is sent (the
  error ``requests`` would raise quotes the header, so the token).

What failed is said in one sentence with its fix (``explain_connection_error``, ``explain_answer``), in the log line
and in the exception: the control plane's host does not resolve (DNS), TLS failed, the connection was refused or
timed out, a redirect (not followed), the ingress refused this cluster's source address (a 403 that is not the control plane's JSON), an HTML
page or a ``not_found`` answered instead of the internal API (the public console: the internal plane is closed), a
401 (the token). A 2xx that is not JSON (a console page) is refused, not taken as a report that got through.

Error bodies are ``{"code": "...", "detail": "..."}`` (codes in ``contract``).

Every answer's ``server_time`` (a 2xx body, or an error body that carries one, such as ``report_from_future``) updates
the shared ``operator_agent.clock.ClockOffset``: the offset of this node's clock from the control plane's.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests
import urllib3.exceptions

from contract import ACTIVITY_PATH, INVENTORY_PATH, INVENTORY_SNAPSHOT_REQUIRED, STORAGE_PATH, USAGE_PATH
from operator_agent import __version__
from operator_agent.clock import ClockOffset
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_errors import (  # noqa: F401  (re-exported: callers catch them from the client)
    ControlPlaneAuthError,
    ControlPlaneError,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
)
from operator_agent.token import NoTokenError, TokenSource

__all__ = [
    "ControlPlaneAuthError",
    "ControlPlaneClient",
    "ControlPlaneError",
    "ControlPlaneRejected",
    "ControlPlaneUnavailable",
    "TokenUnavailable",
    "backoff_delay",
    "explain_answer",
    "explain_connection_error",
]

logger = logging.getLogger(__name__)

BACKOFF_BASE = 1.0
"""First retry delay, in seconds, before jitter."""

DEFAULT_MAX_ATTEMPTS = 5
"""Attempts per call (1 + 4 retries: about 1+2+4+8 = 15 s of backoff before jitter)."""

MAX_TOKEN_FALLBACKS = 2
"""Other tokens tried at once, per call, after a 401 (file, Secret and memory: at most two others)."""

USER_AGENT = f"gshare-operator/{__version__}"
_MAX_BODY_IN_LOG = 300
_MAX_DETAIL = 4000  # longest control-plane ``detail`` kept (its fix sentences are far shorter)

#: The control plane chart's values that open its internal plane to the clusters (charts/gshare/values.yaml).
INTERNAL_PLANE_FIX = (
    "in the control plane chart set `ingress.internalPlane.enabled=true` (with `ingress.internalPlane.host`) and put "
    "this cluster's egress address in `ingress.internalPlane.sourceRange`, and point this operator's `controlPlaneUrl` "
    "at that host"
)


class TokenUnavailable(ControlPlaneError):
    """The operator token file is missing, unreadable or empty."""


@dataclass(frozen=True)
class _ErrorBody:
    code: str | None
    detail: str
    data: dict | None = None


def backoff_delay(
    attempt: int, *, cap: float, base: float = BACKOFF_BASE, rng: Callable[[], float] = random.random
) -> float:
    """Delay before retry number ``attempt`` (0-based): ``min(cap, base * 2**attempt)`` with "equal jitter".

    The result lies in ``[d/2, d]`` for ``d = min(cap, base * 2**attempt)``: never zero (no
    retry storm), never above ``cap``, and spread so many operators do not retry in step.
    """
    ceiling = min(cap, base * (2 ** min(attempt, 62)))
    return ceiling / 2 + ceiling / 2 * rng()


class ControlPlaneClient:
    """Client of the control plane's ``/internal/v1`` routes for one operator.

    Args:
        config: the operator config (URL, token file, timeouts, backoff cap).
        session: a ``requests.Session`` to use (one is created when omitted).
        sleep: called with the backoff delay in seconds between attempts (``time.sleep`` by
            default; the main loop passes ``threading.Event.wait`` so SIGTERM cuts it short).
        stopped: returns ``True`` when the process is shutting down; checked before every
            attempt, after which no further attempt is made.
        rng: returns a float in ``[0, 1)`` for the backoff jitter.
        max_attempts: attempts per call, including the first.
        tokens: where the token comes from (shared between clients); by default the token file only.
        on_success: called with the route's path (``INVENTORY_PATH`` ...) after each call answered 2xx (the operator's
            ``/metrics`` keeps the time of each report's last success: ``operator_agent.metrics``).
        clock: where the offset of this node's clock from the control plane's is kept (shared between clients, like
            ``tokens``); a private one when omitted.
    """

    def __init__(
        self,
        config: OperatorConfig,
        *,
        session: requests.Session | None = None,
        sleep: Callable[[float], object] = time.sleep,
        stopped: Callable[[], bool] = lambda: False,
        rng: Callable[[], float] = random.random,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        tokens: TokenSource | None = None,
        on_success: Callable[[str], object] | None = None,
        clock: ClockOffset | None = None,
    ):
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.config = config
        self.tokens = tokens or TokenSource(config.token_file, cluster_id=config.cluster_id)
        self.session = session or requests.Session()
        self._sleep = sleep
        self._stopped = stopped
        self._rng = rng
        self.max_attempts = max_attempts
        self._on_success = on_success
        self.clock = clock or ClockOffset()

    def put_inventory(self, snapshot: dict) -> dict:
        """``PUT /internal/v1/inventory`` with the snapshot of ``operator_agent.reporters.inventory``, or a digest-only report
        (``{"digest", "checks"?}``); return the response body.

        Raises:
            ControlPlaneUnavailable, ControlPlaneAuthError, ControlPlaneRejected, TokenUnavailable. A digest-only report
            refused with 409 ``inventory_snapshot_required`` (or 400 ``invalid_inventory``: a control plane that predates
            them) raises ``ControlPlaneRejected`` without an error in the log: the caller sends the full snapshot.
        """
        quiet = frozenset({INVENTORY_SNAPSHOT_REQUIRED, "invalid_inventory"}) if "nodes" not in snapshot else frozenset()
        return self.request("PUT", INVENTORY_PATH, json_body=snapshot, quiet_codes=quiet)

    def post_storage(self, report: dict) -> dict:
        """``POST /internal/v1/storage`` with the volume-sync report of ``operator_agent.reporters.storage``; return the body.

        Raises:
            ControlPlaneUnavailable, ControlPlaneAuthError, ControlPlaneRejected, TokenUnavailable.
        """
        return self.request("POST", STORAGE_PATH, json_body=report)

    def post_usage(self, samples: list[dict]) -> dict:
        """``POST /internal/v1/usage`` with a batch of usage samples (``operator_agent.reporters.usage``); return the body.

        Raises:
            ControlPlaneUnavailable, ControlPlaneAuthError, ControlPlaneRejected (``body`` holds the ``index`` of a
            400 ``invalid_usage_sample``), TokenUnavailable.
        """
        return self.request("POST", USAGE_PATH, json_body={"samples": samples})

    def post_activity(self, report: dict) -> dict:
        """``POST /internal/v1/activity`` with the GPU activity report of ``operator_agent.reporters.activity``; return the body.

        Args:
            report: ``{"sessions": [...]}`` as ``contract.ACTIVITY_SCHEMA`` describes.

        Raises:
            ControlPlaneUnavailable, ControlPlaneAuthError, ControlPlaneRejected, TokenUnavailable.
        """
        return self.request("POST", ACTIVITY_PATH, json_body=report)

    def request(self, method: str, path: str, *, json_body: Any = None, quiet_codes: frozenset[str] = frozenset()) -> dict:
        """Send ``method path`` with retries (see the module docstring) and return the decoded JSON body.

        A 2xx with an empty or non-object body returns ``{}``. A 4xx whose ``code`` is in ``quiet_codes`` (an answer the
        caller expects and acts on) raises ``ControlPlaneRejected`` logged at debug level only.
        """
        url = self.config.control_plane_url + path
        what = f"{method} {path}"
        last_problem = "no attempt made"
        attempt = fallbacks = 0
        while True:
            if self._stopped():
                raise ControlPlaneUnavailable(f"{what}: stopped before completion ({last_problem})")
            token = self._read_token()
            sent = self.clock.monotonic()
            try:
                response = self.session.request(
                    method,
                    url,
                    json=json_body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Accept": "application/json",
                        "User-Agent": USER_AGENT,
                    },
                    timeout=self.config.http_timeout,
                    allow_redirects=False,
                )
            except requests.RequestException as exc:
                # The exception text names the URL and the OS error, never the headers.
                last_problem = f"{explain_connection_error(exc, url, timeout=self.config.http_timeout)} ({type(exc).__name__}: {exc})"
                retry_after = None
            else:
                status = response.status_code
                self._learn_time(response, sent)
                if 200 <= status < 300 and not _foreign_answer(response):
                    answer = _json_object(response)
                    if self._on_success is not None:
                        self._on_success(path)
                    return answer
                body = _error_body(response)
                explained = explain_answer(status, url, code=body.code, foreign=_foreign_answer(response),
                                           location=response.headers.get("Location") or "")
                alternative = self.tokens.reject(token) if status == 401 and fallbacks < MAX_TOKEN_FALLBACKS else None
                if alternative is not None:
                    fallbacks += 1
                    logger.warning("control plane answered 401 %s to %s; trying %s", body.code or "unauthorized", what, alternative.describe())
                    continue
                if status == 401:
                    logger.error(
                        "operator token expired or revoked: rotate it (control plane answered 401 %s to %s): %s; on the "
                        "control plane run `manage.py rotate_operator_tokens --cluster %s`",
                        body.code or "unauthorized",
                        what,
                        body.detail,
                        self.config.cluster_id,
                    )
                    raise ControlPlaneAuthError(
                        f"{what}: 401 {body.code}: {body.detail}", status=status, code=body.code, detail=body.detail,
                        body=body.data,
                    )
                if explained and status < 500:
                    logger.error("%s failed: %s (answered %d: %s)", what, explained, status, body.detail[:_MAX_BODY_IN_LOG])
                    raise ControlPlaneRejected(
                        f"{what}: {explained}", status=status, code=body.code, detail=body.detail, body=body.data,
                    )
                if status != 429 and status < 500 and body.code in quiet_codes:
                    logger.debug("control plane answered %s to %d %s", what, status, body.code)
                    raise ControlPlaneRejected(
                        f"{what}: {status} {body.code}: {body.detail}", status=status, code=body.code, detail=body.detail, body=body.data,
                    )
                if status != 429 and status < 500:
                    logger.error(
                        "control plane refused %s with %d %s: %s", what, status, body.code or "error", body.detail
                    )
                    raise ControlPlaneRejected(
                        f"{what}: {status} {body.code}: {body.detail}",
                        status=status,
                        code=body.code,
                        detail=body.detail,
                        body=body.data,
                    )
                last_problem = " ".join(filter(None, [f"HTTP {status}", body.code])) + f": {body.detail}"
                if explained:
                    last_problem = f"{explained} ({last_problem[:_MAX_BODY_IN_LOG]})"
                retry_after = _retry_after(response)
            attempt += 1
            if attempt >= self.max_attempts:
                break
            delay = backoff_delay(attempt - 1, cap=self.config.backoff_max, rng=self._rng)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.config.backoff_max))
            logger.warning(
                "%s failed (attempt %d/%d: %s); retrying in %.1fs",
                what,
                attempt,
                self.max_attempts,
                last_problem,
                delay,
            )
            self._sleep(delay)
        raise ControlPlaneUnavailable(f"{what}: giving up after {self.max_attempts} attempts ({last_problem})")

    def _learn_time(self, response: requests.Response, sent) -> None:
        """Update the clock offset from the answer's ``server_time``, if it is a JSON object that has one."""
        received = self.clock.monotonic()
        try:
            data = response.json() if response.content else None
        except ValueError:
            return
        if isinstance(data, dict) and "server_time" in data:
            self.clock.learn(data["server_time"], sent=sent, received=received)

    def _read_token(self) -> str:
        """The newest operator token now (file re-read, Secret, memory: rotation without restart).

        Raises:
            TokenUnavailable: there is none, or it holds a character an HTTP header cannot carry (``requests`` would
                refuse it with an error quoting the whole header, the token included; the message never does).
        """
        try:
            token = self.tokens.current()
        except NoTokenError as exc:
            message = str(exc)
            logger.error("%s", message)
            raise TokenUnavailable(message) from None
        if not (token.isascii() and token.isprintable()) or any(character.isspace() for character in token):
            message = (
                "the operator token holds a character an HTTP header cannot carry (a line break, a space or a non-ASCII "
                f"character inside it): write it again, on one line, into the token Secret (file {self.config.token_file}); "
                f"on the control plane `manage.py rotate_operator_tokens --cluster {self.config.cluster_id}` writes a new one"
            )
            logger.error("%s", message)
            raise TokenUnavailable(message)
        return token


def _host_of(url: str) -> tuple[str, int | None]:
    parsed = urllib3.util.parse_url(url)
    return parsed.host or url, parsed.port or {"https": 443, "http": 80}.get(parsed.scheme or "")


def _causes(exc: BaseException):
    """``exc`` and what it wraps: ``args[0]`` (requests wraps urllib3's ``MaxRetryError``), ``reason``, the chain."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [getattr(current, "reason", None), current.__cause__, current.__context__]
        if current.args and isinstance(current.args[0], BaseException):
            wrapped.insert(0, current.args[0])
        todo.extend(item for item in wrapped if isinstance(item, BaseException))


def explain_connection_error(exc: BaseException, url: str, *, timeout: float | None = None) -> str:
    """One sentence naming why ``url`` could not be reached (no HTTP answer) and the fix.

    Args:
        exc: what ``requests`` raised (or any exception it wraps).
        url: the URL dialled (its host and port are named; it holds no secret).
        timeout: seconds the call was given, for a timeout's sentence.

    Returns:
        The sentence: DNS (the host does not resolve), TLS (certificate or protocol), connection refused, timed out,
        or "cannot connect" with the OS error for anything else.
    """
    host, port = _host_of(url)
    causes = list(_causes(exc))
    if any(isinstance(c, (urllib3.exceptions.NameResolutionError, socket.gaierror)) for c in causes):
        return (
            f"DNS failure: {host} does not resolve from this cluster; the operator's `controlPlaneUrl` must name the "
            "control plane's internal-plane host (`ingress.internalPlane.host`), and this cluster's DNS must resolve it"
        )
    if any(isinstance(c, (requests.exceptions.SSLError, urllib3.exceptions.SSLError)) for c in causes):
        reason = next((str(c) for c in causes if type(c).__module__ == "ssl"), "")
        return (
            f"TLS failure talking to {host}:{port}{' (' + reason + ')' if reason else ''}: the certificate of "
            "`ingress.internalPlane.tlsSecretName` must be valid for that host and signed by a CA this pod trusts, "
            "and `controlPlaneUrl` must say https only where TLS is served"
        )
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return (
            f"connection refused by {host}:{port}: nothing listens there; check the port of `controlPlaneUrl` and that "
            f"the control plane's ingress serves that host ({INTERNAL_PLANE_FIX})"
        )
    if any(isinstance(c, (requests.exceptions.Timeout, TimeoutError, socket.timeout)) for c in causes):
        budget = f" within {timeout:g} s" if timeout else ""
        return (
            f"no answer from {host}:{port}{budget}: a firewall drops this cluster's traffic, or the control plane is "
            "overloaded; check that this cluster's egress may reach it"
        )
    return f"cannot connect to {host}:{port} ({type(causes[-1]).__name__}): check `controlPlaneUrl` and this cluster's egress"


def explain_answer(status: int, url: str, *, code: str | None, foreign: bool, location: str = "") -> str:
    """One sentence naming why an HTTP answer from ``url`` is not the control plane's internal API, or "".

    Args:
        status: the HTTP status received.
        url: the URL called.
        code: the ``code`` of a JSON error body, or None.
        foreign: the body is not a JSON object (an HTML page, plain text): someone else answered.
        location: the ``Location`` header of a redirect, or "".

    Returns:
        For a redirect (3xx, not followed: the token would go along): where to, and to set ``controlPlaneUrl`` to it
        (an ingress redirecting http to https); for a 403 that is not the control plane's JSON: the ingress source
        range; for an HTML (non-JSON) page or the control plane's ``not_found`` (``/internal`` is answered only on the
        internal hosts): the internal plane is closed; else "" (the answer is the control plane's own and its
        ``code``/``detail`` say what is wrong).
    """
    host, _ = _host_of(url)
    if 300 <= status < 400:
        where = "".join(ch for ch in location[:200] if ch.isprintable()) or "another URL"
        return (
            f"{host} redirected the call ({status}) to {where}; the operator does not follow redirects (its token would "
            "go along): set `controlPlaneUrl` to the URL the control plane's internal plane serves (https when the "
            "ingress redirects http to https)"
        )
    if status == 403 and foreign:
        return (
            f"{host} refused this cluster's source address (403 from the ingress, not from gShare): add this cluster's "
            "egress address to the control plane chart's `ingress.internalPlane.sourceRange`"
        )
    if foreign and status < 500 and status not in (401, 429):
        return (
            f"{host} answered {status} with a page that is not the control plane's internal API (HTML: the public console "
            f"or another site answered, the internal plane is closed): {INTERNAL_PLANE_FIX}"
        )
    if status == 404 and code == "not_found":
        return (
            f"{host} is not one of the control plane's internal hosts (it answered 404 not_found to /internal: the public "
            f"host, the internal plane is closed there): {INTERNAL_PLANE_FIX}"
        )
    return ""


def _foreign_answer(response: requests.Response) -> bool:
    """True when the body is not empty and not a JSON object (an HTML page, text): not the control plane's API."""
    if not response.content:
        return False
    try:
        return not isinstance(response.json(), dict)
    except ValueError:
        return True


def _json_object(response: requests.Response) -> dict:
    """Decode a 2xx body; ``{}`` when it is empty or not a JSON object."""
    if not response.content:
        return {}
    try:
        data = response.json()
    except ValueError:
        logger.warning("control plane answered %d with a non-JSON body", response.status_code)
        return {}
    return data if isinstance(data, dict) else {}


def _error_body(response: requests.Response) -> _ErrorBody:
    """Parse ``{"code", "detail"}`` (``detail`` cut to ``_MAX_DETAIL`` characters); fall back to a shortened text body."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        code = data.get("code")
        detail = str(data.get("detail")) if data.get("detail") is not None else ""
        if len(detail) > _MAX_DETAIL:  # it goes into log lines and exception messages
            detail = detail[:_MAX_DETAIL] + "…"
        return _ErrorBody(
            code=str(code)[:_MAX_BODY_IN_LOG] if code is not None else None,
            detail=detail,
            data=data,
        )
    text = (response.text or "").strip()
    if len(text) > _MAX_BODY_IN_LOG:
        text = text[:_MAX_BODY_IN_LOG] + "…"
    return _ErrorBody(code=None, detail=text or response.reason or "")


def _retry_after(response: requests.Response) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form is ignored)."""
    raw = response.headers.get("Retry-After")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
