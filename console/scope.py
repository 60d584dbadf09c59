"""The console's cluster scope: the cluster picked in the top bar's **Cluster** selector (or "All clusters").

The choice lives in the login session. Any console URL takes ``?cluster=<id or name>`` (empty or ``all`` for all
clusters): :class:`ClusterScopeMiddleware` stores it and redirects to the same URL without the parameter, so a shared
link keeps its scope and the admin's changelists never see an unknown query parameter. Lists narrow through
:class:`ClusterScopedAdmin`; detail pages of any cluster still open.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.utils.encoding import iri_to_uri

from clusters.models import Cluster
from clusters.refs import clusters_matching

SESSION_KEY = "console_cluster"
#: Longer than any cluster id or name (names are DNS labels, at most 63 characters).
MAX_REF = 200
PARAM = "cluster"
ALL = ("", "all")
#: Paths that are not console pages (the API, the internal plane, the connect path): never scoped, never redirected.
NOT_CONSOLE = ("/api/", "/internal/", "/.well-known/", "/metrics", "/healthz", "/s/", "/static/")


def console_cluster(request) -> Cluster | None:
    """The cluster the console is narrowed to for this request, or None for all clusters.

    Cached on the request (one query per request at most); a stored cluster that has since been deregistered or
    deleted reads as None.
    """
    if hasattr(request, "_console_cluster"):
        return request._console_cluster
    cluster = None
    session = getattr(request, "session", None)
    public_id = session.get(SESSION_KEY) if session is not None else None
    if public_id:
        cluster = Cluster.objects.registered().filter(public_id=public_id).first()
    request._console_cluster = cluster
    return cluster


def set_console_cluster(request, ref: str) -> Cluster | None:
    """Store the scope named by ``ref`` (id or name; empty or ``all``: all clusters) in the login session.

    Returns:
        The cluster now chosen, or None for all clusters (also when ``ref`` names no registered cluster, which is
        reported to the user as a message).
    """
    ref = (ref or "").strip()
    cluster = None
    if ref.lower() not in ALL:
        # A NUL byte (which PostgreSQL refuses in a query) or a ref longer than any id or name names no cluster.
        if "\x00" not in ref and len(ref) <= MAX_REF:
            cluster = clusters_matching(ref).exclude(status=Cluster.Status.DEREGISTERED).first()
        if cluster is None:
            shown = ref if len(ref) <= 80 else ref[:79] + "…"
            messages.warning(request, f"No registered cluster is named or has the id {shown!r}: showing all clusters.")
    if cluster is None:
        request.session.pop(SESSION_KEY, None)
    else:
        request.session[SESSION_KEY] = cluster.public_id
    request._console_cluster = cluster
    return cluster


def same_site_path(request) -> str:
    """The request's path, percent-encoded, made safe to send back as a redirect: a path beginning with ``//`` or
    ``/\\`` (``/%2Fevil.example/``) would be read by browsers as another host, so its leading slashes collapse."""
    path = iri_to_uri(request.path)
    if path.startswith(("//", "/\\")):
        path = "/" + path.lstrip("/\\")
    return path


class ClusterScopeMiddleware:
    """``?cluster=`` on a console GET: store the choice, then redirect to the same URL without it (after the
    session, auth and messages middleware)."""

    def __init__(self, get_response):  # noqa: D107
        self.get_response = get_response

    def __call__(self, request):  # noqa: D102
        if (
            request.method == "GET"
            and PARAM in request.GET
            and not request.path.startswith(NOT_CONSOLE)
            and getattr(request, "user", None) is not None
            and request.user.is_authenticated
        ):
            set_console_cluster(request, request.GET.get(PARAM, ""))
            rest = request.GET.copy()
            rest.pop(PARAM)
            query = urlencode(list(rest.lists()), doseq=True)
            return HttpResponseRedirect(same_site_path(request) + (f"?{query}" if query else ""))
        return self.get_response(request)


class ClusterScopedAdmin:
    """Mixin for a ``ModelAdmin`` whose changelist narrows to the console's cluster.

    Set ``cluster_lookup`` to the ORM path from the model to its cluster (``"cluster"``, ``"device__cluster"``,
    ``"session__cluster"``...). Only the changelist (and the actions run from it) narrow; change pages of any cluster
    still open.
    """

    cluster_lookup: str = "cluster"

    def get_queryset(self, request):  # noqa: D102
        qs = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and (match.url_name or "").endswith("_changelist"):
            cluster = console_cluster(request)
            if cluster is not None:
                qs = self.narrow_to_cluster(qs, cluster)
        return qs

    def narrow_to_cluster(self, qs, cluster: Cluster):
        """``qs`` narrowed to ``cluster`` (override where the cluster is not a foreign key, e.g. audit rows)."""
        return qs.filter(**{self.cluster_lookup: cluster})


def console_scope(request) -> dict:
    """Template context processor: ``console_cluster`` (the chosen cluster or None) and ``console_clusters`` (every
    cluster that is not deregistered, by name, for the top bar's selector). Queries run only when a template
    reads them."""
    from django.utils.functional import SimpleLazyObject

    if request.path.startswith(NOT_CONSOLE) or not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {
        "console_cluster": SimpleLazyObject(lambda: console_cluster(request)),
        "console_clusters": SimpleLazyObject(
            lambda: list(Cluster.objects.registered().order_by("name").only("public_id", "name", "status"))
        ),
    }
