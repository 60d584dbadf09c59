"""The page a cluster's ingress shows for a session path no session answers: ``/s/<id>/...`` of a stopped session
(its route is deleted with it) or of an id that never existed.

Each cluster's routing has a fallback for the ``/s/`` prefix (below every session's own ``/s/<id>/`` route) whose
backend is the control plane; ``gshare.middleware.InternalHostsMiddleware`` hands such a request, on a registered
cluster's ``session_domain`` or an internal host, to :func:`session_ended_view`.

What a stranger may learn: nothing. The page is the same for an ended session and for an unknown id, and reads no row:
whether an id existed, when and why it ended and who stopped it are shown on the console's session page, to its owner
and to staff after they log in (``SessionAdmin``'s ``ended/<id>/`` link, which answers 404 to anyone else).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.http import HttpResponse
from django.template.loader import render_to_string

from core.ids import ID_LENGTH

#: The session path prefix the fallback routes catch (``contract`` session paths are ``/s/<id>/``).
SESSION_PATH_PREFIX = "/s/"

_SESSION_ID = re.compile(rf"ses_[a-z2-7]{{{ID_LENGTH}}}")


def session_id_of(path: str) -> str | None:
    """The session id of a session path (``/s/ses_.../...``), or None when its first segment is not a session id."""
    if not path.startswith(SESSION_PATH_PREFIX):
        return None
    segment = path[len(SESSION_PATH_PREFIX):].split("/", 1)[0]
    return segment if _SESSION_ID.fullmatch(segment) else None


def console_links(public_id: str | None) -> dict[str, str]:
    """``{"start", "why", "console"}``: absolute console URLs (``GSHARE_CONTROL_PLANE_URL``) to start a new session,
    to the session's page by id (login, own or staff only), and to the sessions list."""
    base = settings.GSHARE_CONTROL_PLANE_URL.rstrip("/")
    sessions = f"{base}/gpu_sessions/session/"
    return {"start": f"{sessions}start/", "why": f"{sessions}ended/{public_id}/" if public_id else sessions,
            "console": sessions}


def session_ended_view(request) -> HttpResponse:
    """Any method on ``/s/...``: the gShare page "this session has ended or does not exist", 404, not cached, with
    the links of :func:`console_links`. Its body depends on the path's session id only (never on a row)."""
    public_id = session_id_of(request.path_info)
    body = render_to_string("sessions/session_ended.html", {"public_id": public_id, "links": console_links(public_id)})
    response = HttpResponse(body if request.method != "HEAD" else b"", status=404, content_type="text/html; charset=utf-8")
    # The link that led here may carry a connect token (?token=): never sent on to the console.
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "no-store"
    response["X-Robots-Tag"] = "noindex"
    response["X-Frame-Options"] = "DENY"
    response["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
    return response
