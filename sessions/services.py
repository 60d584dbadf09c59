"""Session services outside the lifecycle: the connect link.

A session's lifecycle (apply, stop, re-apply, status reports, the end and its release) is ``sessions.lifecycle``;
creation with placement is ``sessions.create``.
"""

from __future__ import annotations

from core.errors import FORBIDDEN
from core.exceptions import Conflict, Forbidden
from sessions import connect
from sessions.errors import SESSION_NOT_RUNNING
from sessions.manifests import session_url
from sessions.models import Session
from sessions.permissions import may_open_session


def session_connect(*, session: Session, user) -> str:
    """Mint a connect link for ``session``: its URL with a short-lived connect token.

    The token (RS256, audience ``gshare-connect``, ``use: "link"``, ``GSHARE_CONNECT_TOKEN_TTL`` seconds) names
    the session (``sid``), the user (``sub`` = ``user:<pk>``, ``name``) and the host it is valid on
    (``sessions.connect.link_token_sign``).

    Raises:
        Forbidden: 403 ``forbidden`` when ``user`` is neither the owner nor allowed to open any session
            (``sessions.permissions.may_open_any_session``: staff with ``gpu_sessions.change_session``, superusers).
        Conflict: 409 ``session_not_running`` when the session has ended or has no URL yet.
    """
    if not may_open_session(user, session):
        raise Forbidden("Only the session's owner (or staff allowed to change sessions) may connect to it.", code=FORBIDDEN)
    url = session_url(session)
    if not session.is_live or url is None:
        raise Conflict(f"Session {session.public_id} is {session.phase}: start a new session.", code=SESSION_NOT_RUNNING)
    token = connect.link_token_sign(user=user, session_id=session.public_id, host=session.cluster.session_domain)
    return f"{url}?token={token}"
