"""gunicorn's logger with every credential taken out: ``logger_class`` of ``gshare.gunicorn_hooks``.

A connect link carries its JWT in the query (``?token=``), and both routing modes hand the control plane the original
request: Envoy's ext_authz check as the request target itself (``/internal/connect/ext-authz/s/<id>/lab?token=...``),
ingress-nginx's ``auth-url`` in ``X-Original-URL``. gunicorn's access log writes the request line, the Referer and, in
an operator's own format, any header or environ variable, so without this every link would land in the pods' stdout.

:class:`RedactingLogger` rewrites every atom of the access log before it is formatted and every message of gunicorn's
error log (``Invalid request from ip=...: Invalid HTTP request line: '...'`` quotes the request line):

* the value of every query parameter (``?a=1&token=x`` -> ``?a=[redacted]&token=[redacted]``), in the request line,
  the query string, the Referer, ``X-Original-URL``/``Location`` or any other atom holding a URL: a value the log
  cannot tell safe, so no value is kept; the names stay, for debugging;
* the whole value of the headers that carry credentials (``Authorization``, ``Cookie``, ``Set-Cookie``, ...), as
  request, response or environ atoms;
* anything shaped like a JWT (``eyJ`` + base64url) or an API token (``gsh_...``), wherever it is (a path, a user agent).

The module imports neither Django nor the project: gunicorn loads it in the master process.
"""

from __future__ import annotations

import logging
import re

from gunicorn.glogging import Logger

REDACTED = "[redacted]"

#: Headers whose whole value is a credential (lowercase), as gunicorn names them in atoms: ``{name}i`` (request),
#: ``{name}o`` (response) and ``{http_name}e`` (environ).
CREDENTIAL_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "x-auth-token", "x-csrftoken",
    "x-operator-token",
})

#: A JWT (its header is base64url of ``{"``), an API token (``gsh_<key id>_<secret>``), with any percent-escapes,
#: dots or base64 padding inside, so an encoded or truncated one goes whole.
_TOKEN_SHAPED = re.compile(r"(?:eyJ|gsh_)[A-Za-z0-9_\-.%+/=]*")
#: The query of a URL inside a longer text (a request line, a quoted log message): up to whitespace, a quote or ``#``.
_QUERY_IN_TEXT = re.compile(r"\?([^\s\"'#]*)")
_QUERY_ITEM_SEPARATOR = re.compile(r"([&;])")


def _redact_query(query: str) -> str:
    """``a=1&b&c=2`` -> ``a=[redacted]&[redacted]&c=[redacted]``: names kept, every value (and bare item) replaced."""
    parts = _QUERY_ITEM_SEPARATOR.split(query)
    out = []
    for part in parts:
        if part in ("&", ";") or part == "":
            out.append(part)
        elif "=" in part:
            out.append(part.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(REDACTED)
    return "".join(out)


def redact_text(text: str) -> str:
    """Any text with its URL query values and token-shaped strings replaced by ``[redacted]``.

    Args:
        text: a log message or one access-log atom (a request line, a URL, a header value).

    Returns:
        The text with every ``?query`` reduced to its parameter names and every JWT/API-token shape removed.
    """
    text = _QUERY_IN_TEXT.sub(lambda m: "?" + _redact_query(m.group(1)), text)
    return _TOKEN_SHAPED.sub(REDACTED, text)


def _is_credential_atom(key: str) -> bool:
    if key.startswith("{") and key.endswith(("}i", "}o")):
        return key[1:-2].lower() in CREDENTIAL_HEADERS
    if key.startswith("{") and key.endswith("}e"):
        name = key[1:-2].lower()
        return name.startswith("http_") and name[5:].replace("_", "-") in CREDENTIAL_HEADERS
    return False


def redact_atoms(atoms: dict) -> dict:
    """gunicorn's access-log atoms with no credential left (see the module's description).

    Args:
        atoms: ``Logger.atoms()``'s mapping (``r``, ``q``, ``f``, ``{header}i``, ``{header}o``, ``{var}e``, ...).

    Returns:
        A new mapping: credential headers replaced whole, query strings reduced to names, token shapes removed;
        values that are not strings (sizes, times) unchanged.
    """
    redacted = {}
    for key, value in atoms.items():
        if not isinstance(value, str):
            redacted[key] = value
        elif _is_credential_atom(key):
            redacted[key] = REDACTED if value not in ("", "-") else value
        elif key in ("q", "{query_string}e"):
            redacted[key] = _TOKEN_SHAPED.sub(REDACTED, _redact_query(value))
        else:
            redacted[key] = redact_text(value)
    return redacted


class _RedactingFilter(logging.Filter):
    """Rewrites a record's message (and its formatted traceback) with :func:`redact_text`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):  # the access log: atoms already redacted by RedactingLogger.atoms
            return True
        record.msg, record.args = redact_text(record.getMessage()), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


class RedactingLogger(Logger):
    """gunicorn's :class:`~gunicorn.glogging.Logger` that never writes a credential (see the module's description)."""

    def setup(self, cfg) -> None:
        """gunicorn's setup, then the redaction on its error and access loggers (run again on a reload)."""
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            if not any(isinstance(f, _RedactingFilter) for f in log.filters):
                log.addFilter(_RedactingFilter())

    def atoms(self, resp, req, environ, request_time) -> dict:
        """gunicorn's atoms with every credential redacted (:func:`redact_atoms`)."""
        return redact_atoms(super().atoms(resp, req, environ, request_time))
