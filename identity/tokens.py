"""Services for users' API tokens (stored hashed in ``gshare.ApiToken``)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from audit.services import Action, audit_record
from core.exceptions import ApplicationError, NotFound
from identity.errors import API_TOKEN_INVALID, USER_NOT_FOUND
from identity.models import ApiToken

TOKEN_PREFIX = "gsh"


#: Where a researcher gets a token: the console's own page (staff, who see every user's tokens read-only there, use the
#: command where the control plane runs).
CREATE_ONE = ("create one in the console under My API tokens (`/gshare/apitoken/`, Create API token; the token is shown once); "
              "staff: `manage.py create_api_token <username>`")


class InvalidApiToken(ApplicationError):
    """401: the bearer token is unknown, malformed or revoked."""

    code = API_TOKEN_INVALID
    status = 401


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_KEY_ID = re.compile(r"[0-9a-f]{1,16}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,128}")


@transaction.atomic
def api_token_create(*, username: str, name: str = "default") -> tuple[ApiToken, str]:
    """Create an API token for ``username``.

    Returns:
        ``(row, token_text)``; the text (``gsh_<key_id>_<secret>``, 256 bits of secret) is shown
        once and never stored.

    Raises:
        NotFound: no user has that username.
    """
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"No user named {username!r}: create it first with `manage.py createsuperuser`.", code=USER_NOT_FOUND)
    key_id = secrets.token_hex(4)
    text = f"{TOKEN_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    row = ApiToken(user=user, name=name, key_id=key_id, token_hash=_digest(text))
    row.full_clean()
    row.save()
    audit_record(action=Action.API_TOKEN_CREATE, obj=row, object_repr=f"{username}/{name}", details={"user": username, "name": name})
    return row, text


def api_token_authenticate(*, token: str) -> ApiToken:
    """Return the live token row matching ``token`` (with its user), updating ``last_used_at``.

    Raises:
        InvalidApiToken: malformed, unknown, revoked, or the user is inactive.
    """
    parts = token.split("_", 2)
    # The shape is checked before any query: a NUL or a huge key id would otherwise reach PostgreSQL (a 500).
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not _KEY_ID.fullmatch(parts[1]) or not _SECRET.fullmatch(parts[2]):
        raise InvalidApiToken(f"That is not a gShare API token: {CREATE_ONE}.")
    row = ApiToken.objects.select_related("user").filter(key_id=parts[1], revoked_at__isnull=True).first()
    if row is None or not hmac.compare_digest(row.token_hash, _digest(token)) or not row.user.is_active:
        raise InvalidApiToken(f"Unknown or revoked API token: {CREATE_ONE}.")
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke an API token (idempotent): from now on it is refused with 401 ``api_token_invalid``. Audited once."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        username = token.user.get_username()
        audit_record(action=Action.API_TOKEN_REVOKE, obj=token, object_repr=f"{username}/{token.name}", changes={"revoked_at": (None, token.revoked_at)},
                     details={"user": username, "name": token.name})
    return token
