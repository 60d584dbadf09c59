"""Who may open (connect to) a session: the one rule of the console's Open, the connect-link service and the verify.

A session's owner may always open it. Anyone else only with the right to open any session: an active staff user
holding ``gpu_sessions.change_session`` (the permission that also stops sessions), or an active superuser. Being
staff alone is not enough: a staff account without permissions (a help desk login) sees no session page and opens
nobody's session.
"""

from __future__ import annotations

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
