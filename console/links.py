"""Links of list rows, reversed once per URL name rather than once per row and cell.

Django's ``reverse`` resolves the URL pattern each call; a list of 50 rows with three links each spent more time
reversing than rendering. A row link is the reversed URL of a placeholder id with the row's id put in its place.
"""

from __future__ import annotations

from functools import lru_cache

from django.urls import get_script_prefix, get_urlconf, reverse

_PLACEHOLDER = 987654321


@lru_cache(maxsize=256)
def _template(viewname: str, prefix: str, urlconf: str | None) -> tuple[str, str]:
    url = reverse(viewname, args=[_PLACEHOLDER], urlconf=urlconf)
    head, _, tail = url.rpartition(str(_PLACEHOLDER))
    return head, tail


def row_url_format(viewname: str) -> str:
    """The URL of ``viewname`` with ``{}`` where the object's id goes (``str.format`` it per row; the path has no braces)."""
    head, tail = _template(viewname, get_script_prefix(), get_urlconf())
    return f"{head}{{}}{tail}"


def row_url(viewname: str, pk) -> str:
    """``reverse(viewname, args=[pk])`` for a URL whose one argument is an object's id.

    Args:
        viewname: a URL name taking one argument (``"admin:clusters_node_change"``).
        pk: the object's id (an integer or a string the pattern accepts).

    Returns:
        The URL path, under the current script prefix.
    """
    head, tail = _template(viewname, get_script_prefix(), get_urlconf())
    return f"{head}{pk}{tail}"


@lru_cache(maxsize=256)
def _plain(viewname: str, prefix: str, urlconf: str | None) -> str:
    return reverse(viewname, urlconf=urlconf)


def list_url(viewname: str) -> str:
    """``reverse(viewname)`` for a URL without arguments (a changelist), cached per script prefix."""
    return _plain(viewname, get_script_prefix(), get_urlconf())
