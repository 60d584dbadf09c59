"""The two errors of the Kubernetes gateway (``kube.gateway``) and the one formatter of an apiserver refusal.

* :class:`KubeUnavailable`: no usable answer now (connect failure, a call cut off by its ``Deadline``, a TLS failure,
  5xx, 429). Trying again later may work; Celery tasks retry it.
* :class:`KubeRefused`: the apiserver answered and refused (4xx other than 429), or answered with something that is not
  a Kubernetes API object. Trying again will not help until something changes.

Both are ``KubeError``; neither is an ``ApplicationError``: each service says what the failure means for its caller.

The codes below are the refusals of kubeconfig validation (``kube.kubeconfig.KubeconfigError``, 400), answered by the
cluster registration and change routes (docs/errors.md).
"""

from __future__ import annotations

import json
import re

KUBECONFIG_INVALID = "kubeconfig_invalid"
"""The kubeconfig cannot be used (not YAML, a missing context, cluster, user or server, a placeholder, http, ...)."""

KUBECONFIG_LOCALHOST = "kubeconfig_localhost"
"""The server is, or resolves to, a loopback, unspecified or link-local address: the control plane itself."""

KUBECONFIG_EXEC_FORBIDDEN = "kubeconfig_exec_forbidden"
"""The user authenticates with ``exec`` or ``auth-provider``, which would run a command on the control plane."""

KUBECONFIG_LOCAL_FILE = "kubeconfig_local_file"
"""A certificate, key or token is named by a file path, which the control plane never opens."""

#: Longest apiserver message (and reason phrase) kept in a refusal (a Status message can quote a whole object).
MAX_MESSAGE = 300

# Terminal escape sequences (CSI, OSC, and two-byte ones), then any other C0/C1 control character.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.?)")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
# A credential quoted back: "Bearer <t>", or a kubeconfig/header key followed by its value.
_CREDENTIALS = re.compile(
    r"(?i)(\bbearer\s+|\b(?:token|client-key-data|client-certificate-data|password|authorization)[\"']?\s*[:=]\s*[\"']?)"
    r"(?:bearer\s+)?[^\s\"',;]+"
)


def clean_text(text: str | None, *, secrets: tuple[str, ...] = ()) -> str:
    """Text an apiserver sent (a Status message, a reason phrase), made safe to quote in API answers, logs and audit rows:
    terminal escapes and control characters removed, whitespace collapsed, ``secrets`` and anything that looks like a
    credential (``Bearer ...``, ``token: ...``) replaced by ``[redacted]``, cut to ``MAX_MESSAGE`` characters. A secret
    shorter than 8 characters is not searched for (it would match ordinary words)."""
    secrets = tuple(secret for secret in secrets if len(secret) >= 8)
    # Replaced before the text is cut (a secret across the cut would leave its start) and again once escapes and
    # control characters are gone (they may have split it).
    raw = str(text or "")[: 8 * MAX_MESSAGE + max(map(len, secrets), default=0)]
    for secret in secrets:
        raw = raw.replace(secret, "[redacted]")
    text = _CONTROLS.sub(" ", _ESCAPES.sub("", raw[: 8 * MAX_MESSAGE]))
    for secret in secrets:
        text = text.replace(secret, "[redacted]")
    return " ".join(_CREDENTIALS.sub(r"\1[redacted]", text).split())[:MAX_MESSAGE]


def status_message(body: bytes | str | None, *, secrets: tuple[str, ...] = ()) -> str:
    """The ``message`` of a Kubernetes ``Status`` body (JSON) through :func:`clean_text`; "" when there is none."""
    try:
        data = json.loads(body or "{}")
    except (TypeError, ValueError):
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    return clean_text(str(message), secrets=secrets) if message else ""


class KubeError(Exception):
    """An apiserver call of the gateway failed.

    Attributes:
        status: the HTTP status of the answer, or None when none came.
        reason: the HTTP reason phrase ("Forbidden"), or "".
        message: the apiserver's ``Status`` message, or "".
        server: the apiserver URL, for messages.
    """

    def __init__(self, *, status: int | None = None, reason: str = "", message: str = "", server: str = ""):
        self.status, self.reason, self.message, self.server = status, reason or "", message or "", server
        super().__init__(str(self))

    @property
    def summary(self) -> str:
        """``reason: message`` (or the reason alone): how every error text of the control plane quotes the apiserver."""
        return f"{self.reason}: {self.message}" if self.message else self.reason

    def __str__(self) -> str:
        return f"{self.status} {self.summary}".strip()


class KubeRefused(KubeError):
    """The apiserver refused the call (4xx other than 429), or its answer was not a Kubernetes API object.

    Attributes:
        unreadable: True when the server answered 2xx with a body the gateway could not read (not an apiserver?).
    """

    @property
    def unreadable(self) -> bool:
        return self.status is not None and self.status < 400


class KubeUnavailable(KubeError):
    """No usable answer now: transient (retry later).

    Attributes:
        cause: the exception of the client library behind it (None for a 5xx/429 answer).
        cause_name: its class name (``DeadlineExceeded``, ``MaxRetryError``...), or "" for a 5xx/429 answer.
        deadline_exceeded: the call was cut off because its time budget was spent.
        tls_detail: a sentence naming the fix when the failure is a TLS failure caused by the kubeconfig
            (``kube.client.tls_failure_detail``), else None.
    """

    def __init__(self, *, cause: BaseException | None = None, deadline_exceeded: bool = False, tls_detail: str | None = None, **fields):
        self.cause = cause
        self.cause_name = type(cause).__name__ if cause is not None else ""
        self.deadline_exceeded = deadline_exceeded
        self.tls_detail = tls_detail
        super().__init__(**fields)

    def __str__(self) -> str:
        if self.status:
            return f"answered {self.status} ({self.reason})"
        return f"did not answer ({self.cause_name})"
