"""The path judge of connect verification: which session a request reaches, as ingress-nginx routes it.

nginx picks the session's ``location /s/<id>/`` on the *normalised* URI (``$uri``: percent-decoded,
``.``/``..`` segments resolved, ``//`` merged), while the auth subrequest's ``X-Original-URL`` carries
the *raw* one (ingress-nginx: ``$scheme://$http_host$request_uri``). Reading the session id from the raw
path let ``/s/<mine>/../../s/<yours>/lab`` pass with a token for ``<mine>`` into ``<yours>``'s pod.

So the session id is read from the URI as nginx normalises it (:func:`nginx_uri`, a port of
``ngx_http_parse_complex_uri`` in nginx's ``src/http/ngx_http_parse.c`` with ``merge_slashes on``,
nginx's default and ingress-nginx's), and anything whose routing could be read two ways is refused
outright, even where nginx and this port would agree: dot segments (``.``, ``..``), encoded dots,
slashes, backslashes and NULs (``%2e``, ``%2f``, ``%5c``, ``%00``, any case), a literal backslash,
an empty segment (``//``), and a second ``/s/`` segment. After those refusals the normalised path is
the percent-decoded raw path, which :func:`session_in_request_uri` checks as well.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

#: A session id as ``core.ids`` mints it (``ses_`` and lowercase base32; the operator contract allows up to 32).
SESSION_ID = re.compile(r"ses_[a-z0-9]{1,32}")
# Encoded dot, slash, backslash or NUL (any case), a literal backslash, or an empty segment.
_AMBIGUOUS = re.compile(r"%(?:2e|2f|5c|00)|\\|//", re.IGNORECASE)
_CONTROL = re.compile(rb"[\x00-\x20\x7f]")
_HEX = frozenset(b"0123456789abcdefABCDEF")
# A Host header (or URL authority) that is ``name[:port]`` and nothing else: printable ASCII without a path, query,
# fragment, userinfo or escape character in the name (or a bracketed IPv6 literal), and a port of digits only.
_AUTHORITY = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|(?:(?![/\\?#@:\[\]%])[\x21-\x7e])+)(?::[0-9]{1,5})?")
_SLASH, _DOT, _PERCENT, _QUESTION, _HASH = (ord(c) for c in "/.%?#")
(_USUAL, _AFTER_SLASH, _AFTER_DOT, _AFTER_DOT_DOT, _QUOTED, _QUOTED_SECOND) = range(6)


class PathRefused(Exception):
    """The request URI is not a plain path under one session (the message says why; logged, not sent)."""


def nginx_uri(request_uri: str) -> str | None:
    """The URI nginx routes on (``$uri``) for a raw request URI (``$request_uri``).

    Args:
        request_uri: the raw path and query as the client sent it, e.g. ``/s/ses_x/../y?token=...``
            (a ``str`` of code points below 256, as WSGI hands over header bytes).

    Returns:
        The normalised path, without the query: percent-decoded (``%25``, ``%23`` and ``%3F`` stay
        literal characters, as in nginx), ``//`` merged, ``.`` and ``..`` segments resolved; or None
        where nginx answers 400 instead of routing (``..`` above the root, a bad or truncated ``%``
        escape, ``%00``, a URI not starting with ``/``, a control character, space or non-latin-1 text).
    """
    try:
        raw = request_uri.encode("latin-1")
    except UnicodeEncodeError:
        return None
    if not raw.startswith(b"/") or _CONTROL.search(raw):
        return None  # ngx_http_parse_request_line refuses these before any routing
    path = raw.split(b"?", 1)[0]
    if b"%" not in path and b"#" not in path and b"/." not in path and b"//" not in path:
        return path.decode("latin-1")  # what nginx flags neither complex nor quoted is routed as written
    out = bytearray()
    state = quoted_state = _USUAL
    decoded = 0
    n = len(raw)
    ch, p = raw[0], 1

    def climb() -> bool:
        # ``u -= 4`` then back to the previous "/": drop "<segment>/.." (False: above the root, a 400).
        index = len(out) - 4
        while index >= 0 and out[index] != _SLASH:
            index -= 1
        if index < 0:
            return False
        del out[index + 1:]
        return True

    while p <= n:
        advance = True
        if state == _USUAL:
            if ch == _SLASH:
                state = _AFTER_SLASH
                out.append(ch)
            elif ch == _PERCENT:
                quoted_state, state = state, _QUOTED
            elif ch in (_QUESTION, _HASH):
                break
            else:
                out.append(ch)
        elif state == _AFTER_SLASH:
            if ch == _SLASH:
                pass  # merge_slashes
            elif ch == _DOT:
                state = _AFTER_DOT
                out.append(ch)
            elif ch == _PERCENT:
                quoted_state, state = state, _QUOTED
            elif ch in (_QUESTION, _HASH):
                break
            else:
                state = _USUAL
                out.append(ch)
        elif state == _AFTER_DOT:
            if ch == _SLASH:
                state = _AFTER_SLASH
                out.pop()
            elif ch == _DOT:
                state = _AFTER_DOT_DOT
                out.append(ch)
            elif ch == _PERCENT:
                quoted_state, state = state, _QUOTED
            elif ch in (_QUESTION, _HASH):
                out.pop()
                break
            else:
                state = _USUAL
                out.append(ch)
        elif state == _AFTER_DOT_DOT:
            if ch in (_SLASH, _QUESTION, _HASH):
                if not climb():
                    return None
                if ch != _SLASH:
                    break
                state = _AFTER_SLASH
            elif ch == _PERCENT:
                quoted_state, state = state, _QUOTED
            else:
                state = _USUAL
                out.append(ch)
        elif state == _QUOTED:
            if ch not in _HEX:
                return None
            decoded = int(chr(ch), 16)
            state = _QUOTED_SECOND
        else:  # _QUOTED_SECOND
            if ch not in _HEX:
                return None
            value = decoded * 16 + int(chr(ch), 16)
            if value == 0:
                return None
            if value in (_PERCENT, _HASH, _QUESTION):
                state = _USUAL  # kept as a literal character, never a delimiter
                out.append(value)
            else:
                # nginx feeds the decoded character through the state it was found in: an encoded
                # "/" or "." counts as a slash or dot (hence "%2e%2e" climbs like "..").
                state, ch, advance = quoted_state, value, False
        if advance:
            ch = raw[p] if p < n else 0
            p += 1
    else:
        if state in (_QUOTED, _QUOTED_SECOND):
            return None
        if state == _AFTER_DOT:
            out.pop()
        elif state == _AFTER_DOT_DOT and not climb():
            return None
    return out.decode("latin-1")


def host_of_authority(authority: str) -> str | None:
    """The lowercase host name of a ``Host`` header (or a URL's authority) that is plainly ``name[:port]``.

    nginx's ``ngx_http_validate_host`` (``src/http/ngx_http_request.c``) answers 400 to a Host with a ``/``, a
    control character, a space or ``..``; this is stricter (no ``\\ ? # @ %`` either, a port of digits only), so
    that what routes a request (the host name) and what the verify reads (``X-Original-URL``, built from the raw
    Host) cannot be two different things: ``Host: h/s/<mine>/?token=...&`` would otherwise put a path of its own
    in front of the real request URI.

    Args:
        authority: the header's value as sent, e.g. ``lab-c1.gshare.localhost:8443`` or ``[::1]:80``.

    Returns:
        The host name without its port (brackets dropped, lowercase), or None when it is not a valid host[:port].
    """
    match = _AUTHORITY.fullmatch(authority)
    if match is None or ".." in match["name"]:
        return None
    name = match["name"]
    return (name[1:-1] if name.startswith("[") else name).lower()


def session_in_request_uri(request_uri: str) -> str:
    """The session a request URI reaches through its session Ingress, or a refusal.

    Args:
        request_uri: the raw path and query (what ``X-Original-URL`` holds after the host).

    Returns:
        The session id of ``/s/<session id>`` or ``/s/<session id>/...`` in the path nginx routes on.

    Raises:
        PathRefused: not a session path, a path nginx would refuse (400), or one that could be read
            two ways: a ``.`` or ``..`` segment, ``%2e``/``%2f``/``%5c``/``%00`` in any case, a backslash,
            ``//``, or a second ``/s/`` segment.
    """
    raw_path = re.split(r"[?#]", request_uri, maxsplit=1)[0]
    found = _AMBIGUOUS.search(raw_path)
    if found:
        raise PathRefused(f"ambiguous path ({found.group(0)!r})")
    if any(segment in (".", "..") for segment in raw_path.split("/")):
        raise PathRefused("ambiguous path (dot segment)")
    routed = nginx_uri(request_uri)
    if routed is None:
        raise PathRefused("a URI nginx refuses")
    if routed != unquote_to_bytes(raw_path.encode("latin-1")).decode("latin-1"):
        raise PathRefused("ambiguous path (nginx normalises it)")  # unreachable after the checks above; kept as the invariant
    segments = routed.split("/")
    if len(segments) < 3 or segments[0] != "" or segments[1] != "s" or not SESSION_ID.fullmatch(segments[2]):
        raise PathRefused("not a session path")
    if "s" in segments[3:-1]:
        raise PathRefused("ambiguous path (a second /s/ segment)")
    return segments[2]
