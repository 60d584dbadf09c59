"""What the OpenAPI document (``GET /api/v1/schema/``, drf-spectacular) shows, and to whom.

- Only the public API: the operators' routes under ``/internal/`` are a contract between the control plane and the
  operator (docs/contracts.md), called with an operator token, never by a person, so they are left out.
- Each reader sees what they may call: ``SERVE_PUBLIC`` is off, so drf-spectacular keeps an operation only when the
  view's permission classes admit the caller for that method (a researcher sees no staff-only operation); an
  operation whose staff rule lives in its service instead (it answers a domain code such as
  ``idle_exemption_forbidden``) is marked ``extend_schema(extensions={STAFF_ONLY: True})`` and left out for others.
- One tag per resource (``TAGS`` below, in this order), instead of drf-spectacular's default of the path's first
  segment after the common prefix (``api`` for everything, since ``/api/`` and ``/internal/`` shared none).
- Descriptions come from docstrings written in reStructuredText; Swagger UI renders CommonMark, so inline literals
  (````x````) and roles (``:class:`x```) are turned into CommonMark code spans.
"""

from __future__ import annotations

import re

#: Tags in the order the documentation page lists them: ``(name, description, path prefixes under /api/v1/)``.
TAGS: list[tuple[str, str, tuple[str, ...]]] = [
    ("sessions", "GPU sessions: start, follow, open (connect links), stop, idle exemptions", ("sessions",)),
    ("gpus", "The fleet's GPUs, nodes and prices", ("gpus", "nodes", "prices")),
    ("storage", "Storage pools, volumes and the fleet's storage summary", ("storage",)),
    ("billing", "Credits: account, accruals, ledger, grants", ("billing",)),
    ("clusters", "Clusters: registration, connection test, operator tokens", ("clusters",)),
    ("audit", "The audit trail (staff)", ("audit",)),
    ("account", "Who you are and the server's version", ("me", "version")),
]
#: The OpenAPI extension that marks an operation as staff-only (``extend_schema(extensions={STAFF_ONLY: True})``).
STAFF_ONLY = "x-gshare-staff-only"
_PUBLIC_PREFIX = "/api/v1/"
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def tag_for(path: str) -> str | None:
    """The tag of a public API path (``/api/v1/sessions/{public_id}/`` -> ``"sessions"``), or None outside ``TAGS``."""
    first = path.removeprefix(_PUBLIC_PREFIX).split("/", 1)[0]
    for name, _description, prefixes in TAGS:
        if first in prefixes:
            return name
    return None


def rst_to_commonmark(text: str) -> str:
    """Turn the reStructuredText inline markup of a docstring into CommonMark.

    ````x```` becomes `` `x` ``; a role such as ``:class:`Foo``` or ``:func:`~a.b``` becomes `` `Foo` `` / `` `a.b` ``
    (the role's target, as code). Other text is returned unchanged.
    """
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)


def public_endpoints_only(endpoints: list[tuple], **kwargs) -> list[tuple]:
    """drf-spectacular ``PREPROCESSING_HOOKS`` entry: keep the endpoints under ``/api/v1/``.

    Args:
        endpoints: ``[(path, path_regex, method, callback), ...]`` as drf-spectacular collects them.
    Returns:
        The same tuples, without ``/internal/`` and other non-public routes.
    """
    return [endpoint for endpoint in endpoints if endpoint[0].startswith(_PUBLIC_PREFIX)]


def _render(node):
    if isinstance(node, dict):
        return {key: (rst_to_commonmark(value) if key in ("description", "summary") and isinstance(value, str) else _render(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_render(item) for item in node]
    return node


def tag_and_render(result: dict, generator, request, public: bool) -> dict:
    """drf-spectacular ``POSTPROCESSING_HOOKS`` entry: one tag per resource and CommonMark descriptions.

    Args:
        result: the OpenAPI document as a dict (``paths``, ``components``, ...).
    Args:
        request: the request the document is served for (None from ``manage.py spectacular``); its user decides
            whether operations marked ``STAFF_ONLY`` stay.
        public: True for a document of every operation (``manage.py spectacular``, ``SERVE_PUBLIC``).
    Returns:
        The document without the ``STAFF_ONLY`` operations for a reader who is not staff, each operation's ``tags``
        set from :func:`tag_for`, the top-level ``tags`` list (only the
        tags some operation uses, in ``TAGS`` order) and every ``description``/``summary`` through
        :func:`rst_to_commonmark`.
    """
    staff = bool(public or (request is not None and getattr(request.user, "is_staff", False)))
    used: set[str] = set()
    for path, operations in list(result.get("paths", {}).items()):
        tag = tag_for(path)
        for method, operation in list(operations.items()):
            if method == "parameters" or not isinstance(operation, dict):
                continue
            if operation.pop(STAFF_ONLY, False) and not staff:
                del operations[method]
                continue
            if tag is not None:
                operation["tags"] = [tag]
                used.add(tag)
        if not any(method != "parameters" for method in operations):
            del result["paths"][path]
    result = _render(result)
    result["tags"] = [{"name": name, "description": description} for name, description, _p in TAGS if name in used]
    return result
