"""Who may open (connect to) a session: the one rule of the console's Open, the connect-link service and the verify.

A session's owner may always open it. Anyone else only with the right to open any session: an active staff user
holding ``gpu_sessions.change_session`` (the permission that also stops sessions), or an active superuser. Being
staff alone is not enough: a staff account without permissions (a help desk login) sees no session page and opens
nobody's session.
"""

from __future__ import annotations

from typing import NamedTuple

#: The Django permission that lets staff open any user's session (superusers hold every permission).
OPEN_ANY_PERMISSION = "gpu_sessions.change_session"


def may_open_any_session(user) -> bool:
    """Whether ``user`` may open sessions of other users.

    Args:
        user: a user (``AnonymousUser`` too).

    Returns:
        True for an active superuser, or active staff holding :data:`OPEN_ANY_PERMISSION` (directly or by a group).
    """
    if not (user and user.is_active and (user.is_staff or user.is_superuser)):
        return False
    return user.has_perm(OPEN_ANY_PERMISSION)


def may_open_session(user, session) -> bool:
    """Whether ``user`` may open ``session``: its owner, or :func:`may_open_any_session`."""
    return bool(user and user.is_authenticated and (session.owner_id == user.pk or may_open_any_session(user)))


class SessionActions(NamedTuple):
    """What the console offers on one session: Open and Stop."""

    open: bool
    stop: bool


class SessionRights:
    """One user's rights over sessions, looked up once per request, then applied to each session shown.

    Args:
        user: the request's user.
        may_stop: whether this user may stop the sessions shown to them (the console's stop permission: researchers
            their own, staff with ``gpu_sessions.change_session``).
    """

    def __init__(self, user, *, may_stop: bool):
        self.user = user
        self.may_open_any = may_open_any_session(user)
        self.may_stop = may_stop

    def actions(self, session) -> SessionActions:
        """Open when the session offers it and the user owns it or may open any; Stop when it offers it and the user may stop."""
        user = self.user
        owner = bool(user and user.is_authenticated and session.owner_id == user.pk)
        return SessionActions(open=session.offers_open and (owner or self.may_open_any), stop=session.offers_stop and self.may_stop)
