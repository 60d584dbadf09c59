"""Console pages for API tokens and signing keys: read-only (a deleted signing key would refuse every operator token
it signed), Revoke through the service."""

import pytest

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
