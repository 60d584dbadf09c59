"""Console pages for API tokens and signing keys: read-only (a deleted signing key would refuse every operator token
it signed), Revoke through the service."""

import pytest

from core.crypto import encrypt_text
from identity.keys import signing_key_ensure
from identity.models import ApiToken
from identity.tokens import api_token_create
from tests.console_checks import assert_read_only

pytestmark = pytest.mark.django_db


def test_tokens_and_signing_keys_are_read_only(console, plain_user):
    api_token_create(username=plain_user.username)
    assert_read_only(console, "/gshare/apitoken/", ApiToken.objects.get(user=plain_user))
    key = signing_key_ensure()
    assert_read_only(console, "/gshare/signingkey/", key)
    assert key.private_key_pem not in console.get(f"/gshare/signingkey/{key.pk}/change/").content.decode()


def test_revoke_is_offered_and_keeps_the_row(console, plain_user):
    api_token_create(username=plain_user.username)
    row = ApiToken.objects.get(user=plain_user)
    assert 'value="revoke"' in console.get("/gshare/apitoken/").content.decode()
    assert console.post("/gshare/apitoken/", {"action": "revoke", "_selected_action": [row.pk], "index": 0}).status_code == 302
    row.refresh_from_db()
    assert row.revoked_at is not None


def test_a_token_created_before_an_upgrade_is_shown_once_after_it(console, staff_user):
    # The login session is stored: the page after creating a token reads the key the previous releases wrote, so a
    # token created just before an upgrade is shown, and its encrypted text leaves the session when it is.
    row, text = api_token_create(username=staff_user.username, name="before-upgrade")
    session = console.session
    session["gshare.console.new_api_token"] = {"pk": row.pk, "text": encrypt_text(text)}
    session.save()
    shown = console.get(f"/gshare/apitoken/{row.pk}/created/")
    assert shown.status_code == 200 and text in shown.content.decode()
    assert "gshare.console.new_api_token" not in console.session.keys()
    assert text not in console.get(f"/gshare/apitoken/{row.pk}/created/").content.decode()
