"""API tokens: created by the management command, stored hashed, refused when wrong."""

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from identity.models import ApiToken


@pytest.mark.django_db
def test_create_api_token_prints_a_token_stored_only_as_hash(staff_user):
    out = StringIO()
    call_command("create_api_token", "admin", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("gsh_")
    row = ApiToken.objects.get(user=staff_user)
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in (row.token_hash, row.key_id)


@pytest.mark.django_db
def test_create_api_token_unknown_user_names_the_fix():
    with pytest.raises(CommandError, match="createsuperuser"):
        call_command("create_api_token", "nobody")


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["Bearer gsh_00000000_nope", "Bearer nonsense", "Token abc", "Bearer "])
def test_bad_tokens_get_401_with_code(anon, header):
    response = anon.get("/api/v1/clusters", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["code"] in {"api_token_invalid", "not_authenticated"}


@pytest.mark.django_db
def test_no_token_gets_401(anon):
    response = anon.get("/api/v1/clusters")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


@pytest.mark.django_db
def test_revoked_token_is_refused(http, staff_user):
    assert http.get("/api/v1/clusters").status_code == 200
    from django.utils import timezone

    ApiToken.objects.filter(user=staff_user).update(revoked_at=timezone.now())
    assert http.get("/api/v1/clusters").status_code == 401


@pytest.mark.django_db
def test_console_revoke_action(http, client, staff_user):
    client.force_login(staff_user)
    row = ApiToken.objects.get(user=staff_user)
    response = client.post("/gshare/apitoken/", {"action": "revoke", "_selected_action": [row.pk]})
    assert response.status_code == 302
    assert http.get("/api/v1/clusters").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["Bearer gsh_00000000_nope", "Bearer nonsense", None])
def test_a_refused_token_points_a_researcher_to_the_console_page_that_makes_one(anon, client, plain_user, header):
    """The 401 names the console's My API tokens page, and that page is where a researcher creates a token."""
    response = anon.get("/api/v1/clusters", headers={"Authorization": header} if header else {})
    detail = response.json()["detail"]
    assert response.status_code == 401 and "My API tokens (`/gshare/apitoken/`, " in detail, detail
    assert "staff: `manage.py create_api_token <username>`" in detail
    client.force_login(plain_user)
    page = client.get("/gshare/apitoken/").content.decode()
    assert "My API tokens" in page and "Create API token" in page
