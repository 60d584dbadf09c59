"""The operator token on the data plane: pick the newest one, refresh it before it runs out, write it back.

Where tokens come from (:class:`TokenSource`), read before every request to the control plane:

* the mounted file ``GSHARE_TOKEN_FILE`` (the kubelet refreshes it about a minute after the Secret changes);
* the Secret itself through the Kubernetes API (``GSHARE_OPERATOR_NAMESPACE``/``GSHARE_TOKEN_SECRET_NAME``,
  key ``internal-jwt``), when both variables are set; read at most every ``SECRET_READ_INTERVAL`` seconds,
  and at once after a 401, so a token the control plane just pushed is used without waiting for the kubelet;
* the token this process got by refreshing itself (memory).

The one used is the newest: highest credential generation (claim ``gen``; older generations are revoked), then
latest ``exp``. The payload is decoded without verification (the operator holds no key: the control plane
verifies); a token that cannot be decoded ranks last. A token the control plane refused (401) is passed over
while another candidate exists. So a push by the control plane and a refresh by the operator never fight:
both tokens are valid until they expire, and whichever is newer wins.

Self-refresh (:class:`TokenRefresher`): when less than a quarter of the chosen token's life (``exp - iat``) is
left (jittered down to a fifth, so a fleet does not refresh in step), ``POST /internal/v1/token`` exchanges it
for a fresh one, kept in memory and written back to the Secret (only when the Secret is configured, and only
if the Secret does not already hold a newer token).

Tokens are secrets: never logged, never in an exception message, never in a ``repr``.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contract import (
    OPERATOR_TOKEN_GENERATION_CLAIM,
    OPERATOR_TOKEN_REFRESH_FRACTION,
    OPERATOR_TOKEN_SECRET_KEY,
    OPERATOR_TOKEN_SUBJECT_PREFIX,
    TOKEN_PATH,
)
from operator_agent import kube
from operator_agent.control_plane_errors import ControlPlaneError

if TYPE_CHECKING:  # control_plane_client imports this module
    from operator_agent.control_plane_client import ControlPlaneClient

__all__ = ["Candidate", "NoTokenError", "SecretTokenStore", "TokenInfo", "TokenRefresher", "TokenSource", "token_info"]

logger = logging.getLogger(__name__)

SECRET_READ_INTERVAL = 10.0
"""Seconds a Secret read through the API is reused before it is read again (a 401 reads it at once)."""

REFRESH_FRACTION = OPERATOR_TOKEN_REFRESH_FRACTION
"""Refresh once less than this fraction of the token's life is left (``contract.OPERATOR_TOKEN_REFRESH_FRACTION``) ..."""

REFRESH_JITTER = 0.2
"""... lowered by up to this share of it at random per token (so between 1/5 and 1/4 of the life is left)."""

SOURCE_FILE, SOURCE_SECRET, SOURCE_MEMORY = "file", "secret", "memory"


class NoTokenError(Exception):
    """No operator token is available from any source; the message says what was tried (never a token)."""


@dataclass(frozen=True)
class TokenInfo:
    """The claims of an operator token the operator cares about (decoded, not verified).

    Attributes:
        sub: ``operator:<cluster_id>``, or None.
        iat: issued at, seconds since the epoch, or None.
        exp: expiry, seconds since the epoch, or None.
        gen: credential generation (claim ``gen``; 1 when absent).
    """

    sub: str | None
    iat: int | None
    exp: int | None
    gen: int

    @property
    def expires_at(self) -> str:
        """``exp`` as RFC 3339 UTC, or ``unknown``."""
        if self.exp is None:
            return "unknown"
        return datetime.datetime.fromtimestamp(self.exp, tz=datetime.UTC).isoformat()


def _int_claim(claims: dict, name: str) -> int | None:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def token_info(token: str | None) -> TokenInfo | None:
    """Decode a JWT's payload without verifying it.

    Args:
        token: a compact JWS (``header.payload.signature``).

    Returns:
        A :class:`TokenInfo`, or None when ``token`` is not a JWT with a JSON object payload.
    """
    if not token:
        return None
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(claims, dict):
        return None
    gen = _int_claim(claims, OPERATOR_TOKEN_GENERATION_CLAIM)
    sub = claims.get("sub")
    return TokenInfo(
        sub=sub if isinstance(sub, str) else None, iat=_int_claim(claims, "iat"), exp=_int_claim(claims, "exp"),
        gen=gen if gen is not None and gen >= 1 else 1,
    )


@dataclass(frozen=True)
class Candidate:
    """A token from one source.

    Attributes:
        token: the token (left out of ``repr``).
        source: ``file``, ``secret`` or ``memory``.
        info: its decoded claims, or None when it cannot be decoded.
    """

    token: str = field(repr=False)
    source: str
    info: TokenInfo | None

    @classmethod
    def of(cls, token: str, source: str) -> Candidate:
        """A candidate with its claims decoded."""
        return cls(token=token, source=source, info=token_info(token))

    def rank(self, cluster_id: str | None = None) -> tuple:
        """Sort key, larger is newer: decodable, for ``cluster_id`` (when given), generation, expiry."""
        if self.info is None:
            return (0, 0, 0, 0)
        mine = cluster_id is None or self.info.sub == f"{OPERATOR_TOKEN_SUBJECT_PREFIX}{cluster_id}"
        return (1, int(mine), self.info.gen, self.info.exp or 0)

    def describe(self) -> str:
        """``the file token (generation 2, expires 2026-...)``: safe to log."""
        if self.info is None:
            return f"the {self.source} token (not a JWT the operator can read)"
        return f"the {self.source} token (generation {self.info.gen}, expires {self.info.expires_at})"


class SecretTokenStore:
    """The operator token Secret read and written through the Kubernetes API.

    The operator's RBAC allows get/update/patch on exactly this Secret (no create): a missing Secret is
    reported, never created.

    Args:
        core_v1: a ``CoreV1Api`` of the cluster the operator runs in.
        namespace: the Secret's namespace (``GSHARE_OPERATOR_NAMESPACE``).
        name: the Secret's name (``GSHARE_TOKEN_SECRET_NAME``).
        key: the data key holding the token (``internal-jwt``).
        cluster_id: this cluster's id, to rank tokens (see :meth:`Candidate.rank`).
        request_timeout: seconds per apiserver call.
    """

    def __init__(
        self, core_v1: kube.CoreV1Api, *, namespace: str, name: str, key: str = OPERATOR_TOKEN_SECRET_KEY,
        cluster_id: str | None = None, request_timeout: float = 10.0,
    ):
        self.core_v1 = core_v1
        self.namespace = namespace
        self.name = name
        self.key = key
        self.cluster_id = cluster_id
        self.request_timeout = request_timeout

    @property
    def where(self) -> str:
        """``Secret <namespace>/<name>`` for messages."""
        return f"Secret {self.namespace}/{self.name}"

    def _token_of(self, secret) -> str | None:
        encoded = (secret.data or {}).get(self.key)
        if not encoded:
            return None
        try:
            return base64.b64decode(encoded).decode("utf-8").strip() or None
        except (binascii.Error, ValueError):
            return None

    def read(self) -> str | None:
        """The token in the Secret, or None when the Secret or its key is missing or empty.

        Raises:
            kube.ApiException (other than 404), or a transport error (``kube.apiserver_call`` makes it
            ``KubeUnavailable``).
        """
        try:
            secret = self.core_v1.read_namespaced_secret(self.name, self.namespace, _request_timeout=self.request_timeout)
        except kube.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._token_of(secret)

    def write_if_newer(self, token: str) -> bool:
        """Put ``token`` into the Secret unless it already holds a token at least as new.

        Replaces the Secret with the ``resourceVersion`` read (other keys and metadata kept), so a token
        the control plane pushed meanwhile is never overwritten blindly: a 409 reads again (three tries).

        Returns:
            True when written, False when the Secret already held a newer (or the same) token.

        Raises:
            kube.ApiException (404: the Secret does not exist; 403: RBAC), or a transport error
            (``kube.apiserver_call`` makes it ``KubeUnavailable``).
        """
        new = Candidate.of(token, SOURCE_MEMORY).rank(self.cluster_id)
        last: kube.ApiException | None = None
        for _ in range(3):
            secret = self.core_v1.read_namespaced_secret(self.name, self.namespace, _request_timeout=self.request_timeout)
            existing = self._token_of(secret)
            if existing is not None and Candidate.of(existing, SOURCE_SECRET).rank(self.cluster_id) >= new:
                return False
            secret.data = {**(secret.data or {}), self.key: base64.b64encode(token.encode()).decode()}
            try:
                self.core_v1.replace_namespaced_secret(self.name, self.namespace, secret, _request_timeout=self.request_timeout)
                return True
            except kube.ApiException as exc:
                if exc.status != 409:
                    raise
                last = exc
        assert last is not None
        raise last


class TokenSource:
    """The operator token to send: the newest of the file, the Secret (when configured) and memory.

    Thread-safe: the inventory loop and the session reconciler share one.

    Args:
        token_file: path of the mounted token (re-read on every call).
        secret: the Secret store, or None when ``GSHARE_OPERATOR_NAMESPACE``/``GSHARE_TOKEN_SECRET_NAME`` are unset.
        cluster_id: this cluster's id (tokens for it rank above tokens for another).
        secret_read_interval: seconds a Secret read is reused.
        clock: monotonic seconds (for the Secret cache).
    """

    def __init__(
        self, token_file: str, *, secret: SecretTokenStore | None = None, cluster_id: str | None = None,
        secret_read_interval: float = SECRET_READ_INTERVAL, clock: Callable[[], float] = time.monotonic,
    ):
        self.token_file = token_file
        self.secret = secret
        self.cluster_id = cluster_id
        self.secret_read_interval = secret_read_interval
        self._clock = clock
        self._lock = threading.RLock()
        self._memory: str | None = None
        self._secret_token: str | None = None
        self._secret_read_at: float | None = None
        self._secret_problem: str | None = None
        self._rejected: set[str] = set()
        self._last_used: str | None = None

    # ----------------------------------------------------------------- sources

    def _read_file(self) -> tuple[str | None, str | None]:
        """``(token, problem)`` from the token file."""
        path = self.token_file
        try:
            with open(path, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as exc:
            return None, f"cannot read operator token file {path}: {exc.strerror or exc}"
        if not token:
            return None, f"operator token file {path} is empty"
        return token, None

    def _read_secret(self, fresh: bool) -> tuple[str | None, str | None]:
        """``(token, problem)`` from the Secret, cached for ``secret_read_interval`` seconds."""
        if self.secret is None:
            return None, None
        now = self._clock()
        if not fresh and self._secret_read_at is not None and now - self._secret_read_at < self.secret_read_interval:
            return self._secret_token, self._secret_problem
        problem = None
        try:
            with kube.apiserver_call():
                token = self.secret.read()
            if token is None:
                problem = f"{self.secret.where} does not exist or has no key {self.secret.key}"
        except kube.ApiException as exc:
            token, problem = None, f"cannot read {self.secret.where}: {exc.status} {exc.reason}"
        except kube.KubeUnavailable as exc:
            token, problem = None, f"cannot reach the apiserver to read {self.secret.where}: {exc.kind}"
        if problem != self._secret_problem:
            if problem:
                logger.warning("%s; using the other token sources", problem)
            else:
                logger.info("reading the operator token from %s again", self.secret.where)
        self._secret_token, self._secret_problem, self._secret_read_at = token, problem, now
        return token, problem

    def candidates(self, *, fresh: bool = False) -> tuple[list[Candidate], list[str]]:
        """Every token available now, and the problems met reading the sources.

        Args:
            fresh: read the Secret even if the last read is recent.
        """
        with self._lock:
            found, problems = [], []
            for source, (token, problem) in ((SOURCE_FILE, self._read_file()), (SOURCE_SECRET, self._read_secret(fresh))):
                if token:
                    found.append(Candidate.of(token, source))
                if problem:
                    problems.append(problem)
            if self._memory:
                found.append(Candidate.of(self._memory, SOURCE_MEMORY))
            return found, problems

    # ----------------------------------------------------------------- choice

    def best(self, *, fresh: bool = False) -> Candidate:
        """The newest token not refused by the control plane (or, if every one was, the newest of all).

        Raises:
            NoTokenError: no source has a token; the message lists what was tried.
        """
        with self._lock:
            found, problems = self.candidates(fresh=fresh)
            if not found:
                raise NoTokenError("; ".join(problems) or f"operator token file {self.token_file} is empty")
            self._rejected &= {candidate.token for candidate in found}  # forget tokens no source holds any more
            usable = [candidate for candidate in found if candidate.token not in self._rejected] or found
            chosen = max(usable, key=lambda candidate: candidate.rank(self.cluster_id))
            if chosen.token != self._last_used:
                if self._last_used is not None or chosen.source != SOURCE_FILE:
                    logger.info("operator token: using %s", chosen.describe())
                self._last_used = chosen.token
            return chosen

    def current(self, *, fresh: bool = False) -> str:
        """The token to send now (see :meth:`best`).

        Raises:
            NoTokenError: no source has a token.
        """
        return self.best(fresh=fresh).token

    def remember(self, token: str) -> None:
        """Keep a token obtained by self-refresh in memory (it competes with the file and the Secret)."""
        with self._lock:
            self._memory = token
            self._rejected.discard(token)

    def reject(self, token: str) -> Candidate | None:
        """Note that the control plane refused ``token`` (401); forget it if it was the one in memory.

        Returns:
            The other token to try now (the Secret is read again first), or None when there is none.
        """
        with self._lock:
            self._rejected.add(token)
            if self._memory == token:
                self._memory = None
            try:
                chosen = self.best(fresh=True)
            except NoTokenError:
                return None
            return chosen if chosen.token != token else None


#: Seconds the refresher waits after the control plane refused an exchange (409/429), or after another failure.
REFUSED_RETRY_SECONDS = 60.0
FAILED_RETRY_SECONDS = 10.0


class TokenRefresher:
    """Self-refresh: exchange the current token at ``POST /internal/v1/token`` when it is getting old.

    Args:
        tokens: the shared :class:`TokenSource` (the new token is remembered there, and written to its Secret).
        client: the control-plane client used for the exchange.
        clock: wall-clock seconds since the epoch (token times are epoch seconds).
        rng: returns a float in ``[0, 1)`` for the jitter.
    """

    def __init__(
        self, tokens: TokenSource, client: ControlPlaneClient, *, clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ):
        self.tokens = tokens
        self.client = client
        self._clock = clock
        self._rng = rng
        self._jitter: tuple[tuple, float] | None = None
        self._not_before = 0.0  # after a refused or failed exchange, wait before asking again

    def refresh_at(self, candidate: Candidate) -> float | None:
        """Epoch seconds after which ``candidate`` should be refreshed; None when its claims do not tell.

        Between ``exp - life/4`` and ``exp - life/5`` (``life = exp - iat``), fixed per token.
        """
        info = candidate.info
        if info is None or info.iat is None or info.exp is None or info.exp <= info.iat:
            return None
        identity = (info.sub, info.iat, info.exp, info.gen)
        if self._jitter is None or self._jitter[0] != identity:
            self._jitter = (identity, self._rng())
        fraction = REFRESH_FRACTION * (1 - REFRESH_JITTER * self._jitter[1])
        return info.exp - (info.exp - info.iat) * fraction

    def maybe_refresh(self) -> bool:
        """Refresh the token if it is due; never raises for I/O failures (they are logged).

        Returns:
            True when a new token was obtained.
        """
        try:
            current = self.tokens.best()
        except NoTokenError:
            return False
        due = self.refresh_at(current)
        if due is None or self._clock() < max(due, self._not_before):
            return False
        logger.info("operator token: refreshing %s", current.describe())
        try:
            body = self.client.request("POST", TOKEN_PATH)
        except ControlPlaneError as exc:
            # 401s were logged by the client with the control plane's code and detail. A 409
            # (token_refresh_too_early: clocks disagree) or 429 (throttled) is not retried at once.
            self._not_before = self._clock() + (REFUSED_RETRY_SECONDS if exc.status in (409, 429) else FAILED_RETRY_SECONDS)
            logger.warning("operator token not refreshed: %s", exc)
            return False
        token = body.get("token")
        fresh = Candidate.of(token, SOURCE_MEMORY) if isinstance(token, str) else None
        if fresh is None or fresh.info is None or fresh.info.exp is None:
            logger.error("operator token not refreshed: the control plane's answer to POST %s holds no token", TOKEN_PATH)
            return False
        self.tokens.remember(fresh.token)
        written = ""
        if self.tokens.secret is not None:
            store = self.tokens.secret
            try:
                with kube.apiserver_call():
                    newer = store.write_if_newer(fresh.token)
                written = f"; written to {store.where}" if newer else f"; {store.where} already holds a newer one"
            except kube.ApiException as exc:
                written = f"; NOT written to {store.where} ({exc.status} {exc.reason}: check the chart's Role)"
            except kube.KubeUnavailable as exc:
                written = f"; NOT written to {store.where} (apiserver unreachable: {exc.kind})"
        logger.info("operator token refreshed: generation %d, expires %s%s", fresh.info.gen, fresh.info.expires_at, written)
        return True
