"""Signing key rotation and import: old tokens keep verifying, the JWKS drops a key only after every
token it signed has expired, the monthly beat schedule, ``rotate_signing_key``, ``import_signing_key``.

Time moves through the services' ``now`` argument (the moment of a rotation or a retirement run), never
by patching the clock.
"""

from datetime import timedelta

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from clusters.operator_token.tokens import MAX_TTL as OPERATOR_MAX_TTL
from gshare.celery import app
from identity import tasks
from identity.internal_jwt import (
    CONNECT_AUDIENCE,
    OPERATOR_AUDIENCE,
    InvalidInternalToken,
    public_jwks,
    sign_internal_jwt,
    verify_internal_jwt,
)
from identity.keys import (
    MAX_TOKEN_TTL,
    SCHEDULED_ROTATION_MIN_AGE,
    signing_key_ensure,
    signing_key_import,
    signing_key_retire_time,
    signing_key_rotate,
    signing_key_rotate_scheduled,
    signing_keys_published,
    signing_keys_retire,
)
from identity.models import SigningKey
from tests.helpers import run_threads

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)


def long_ago():
    """A moment longer ago than a replaced key is kept: a rotation then has a retire time in the past."""
    now = timezone.now()
    return now - (signing_key_retire_time(now) - now) - SECOND


def jwks_kids() -> set[str]:
    return {key["kid"] for key in public_jwks()["keys"]}


def kid_of(token: str) -> str:
    return jwt.get_unverified_header(token)["kid"]


def rsa_pem(bits: int = 2048, fmt=serialization.PrivateFormat.PKCS8, password: bytes | None = None) -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, fmt, encryption)


def import_command(tmp_path, pem: bytes, capsys) -> tuple[str, str]:
    path = tmp_path / "signing-key.pem"
    path.write_bytes(pem)
    call_command("import_signing_key", "--file", str(path))
    captured = capsys.readouterr()
    return captured.out, captured.err


def assert_no_key_material(text: str, pem: bytes) -> None:
    assert "PRIVATE KEY-----" not in text
    for line in pem.decode(errors="replace").splitlines():
        if len(line) >= 16 and not line.startswith("-----"):
            assert line not in text


# --------------------------------------------------------------------------- rotation


def test_token_signed_before_rotation_verifies_after_and_new_tokens_carry_the_new_kid():
    old = signing_key_ensure()
    operator_token = sign_internal_jwt("operator:clu_abc", 600)
    connect_token = sign_internal_jwt("user:1", 300, audience=CONNECT_AUDIENCE, claims={"sid": "ses_1"})
    rotation = signing_key_rotate()
    assert rotation.created and rotation.active.kid != old.kid
    assert [k.kid for k in rotation.replaced] == [old.kid]
    new_token = sign_internal_jwt("operator:clu_abc", 600)
    assert kid_of(new_token) == rotation.active.kid
    assert kid_of(operator_token) == old.kid
    assert verify_internal_jwt(operator_token, OPERATOR_AUDIENCE)["sub"] == "operator:clu_abc"
    assert verify_internal_jwt(connect_token, CONNECT_AUDIENCE)["sid"] == "ses_1"
    assert verify_internal_jwt(new_token, OPERATOR_AUDIENCE)["sub"] == "operator:clu_abc"
    assert jwks_kids() == {old.kid, rotation.active.kid}
    assert SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).count() == 1


def test_jwks_lists_the_old_key_until_its_retire_time_then_only_the_new_one():
    old = signing_key_ensure()
    token = sign_internal_jwt("operator:clu_abc", 600)
    rotated_at = timezone.now()
    rotation = signing_key_rotate(now=rotated_at)
    old.refresh_from_db()
    assert old.status == SigningKey.Status.PUBLISHED
    assert old.retire_after == signing_key_retire_time(rotated_at)
    assert old.retire_after.utcoffset() == timedelta(0)

    assert signing_keys_retire(now=old.retire_after - SECOND) == []  # one second before: nothing yet
    assert set(signing_keys_published(now=old.retire_after - SECOND).values_list("kid", flat=True)) == {old.kid, rotation.active.kid}
    assert jwks_kids() == {old.kid, rotation.active.kid}
    assert verify_internal_jwt(token, OPERATOR_AUDIENCE)

    assert signing_keys_retire(now=old.retire_after) == [old.kid]
    old.refresh_from_db()
    assert old.status == SigningKey.Status.RETIRED and old.retired_at == old.retire_after
    assert jwks_kids() == {rotation.active.kid}
    assert signing_keys_retire(now=old.retire_after) == []  # idempotent


def test_a_key_past_its_retire_time_leaves_the_jwks_before_any_task_runs():
    old = signing_key_ensure()
    token = sign_internal_jwt("operator:clu_abc", 60)
    # A rotation that happened longer ago than the longest token lifetime: its retire time is in the past.
    rotation = signing_key_rotate(now=long_ago())
    old.refresh_from_db()
    assert old.status == SigningKey.Status.PUBLISHED and old.retire_after < timezone.now()
    assert jwks_kids() == {rotation.active.kid}
    with pytest.raises(InvalidInternalToken, match="does not publish"):
        verify_internal_jwt(token, OPERATOR_AUDIENCE)
    assert signing_keys_retire() == [old.kid]


def test_retire_time_outlives_the_longest_token_the_old_key_can_have_signed():
    signing_key_ensure()
    longest = sign_internal_jwt("operator:clu_abc", MAX_TOKEN_TTL)
    rotated_at = timezone.now()
    signing_key_rotate(now=rotated_at)
    exp = verify_internal_jwt(longest, OPERATOR_AUDIENCE)["exp"]
    # The verifier accepts the token until exp + leeway; the key is published at least that long.
    assert exp + settings.GSHARE_JWT_LEEWAY <= signing_key_retire_time(rotated_at).timestamp()
    assert OPERATOR_MAX_TTL <= MAX_TOKEN_TTL
    for ttl in (settings.GSHARE_OPERATOR_TOKEN_TTL, settings.GSHARE_CONNECT_TOKEN_TTL, settings.GSHARE_CONNECT_COOKIE_TTL):
        assert ttl <= MAX_TOKEN_TTL
    with pytest.raises(ValueError, match="at most"):
        sign_internal_jwt("operator:clu_abc", MAX_TOKEN_TTL + 1)


def test_scheduled_rotation_is_idempotent():
    first = signing_key_ensure()
    not_yet = first.created_at + SCHEDULED_ROTATION_MIN_AGE - SECOND
    assert not signing_key_rotate_scheduled(now=not_yet).created
    due = first.created_at + SCHEDULED_ROTATION_MIN_AGE + SECOND
    rotation = signing_key_rotate_scheduled(now=due)
    assert rotation.created and rotation.replaced[0].kid == first.kid
    again = signing_key_rotate_scheduled(now=due)  # the same run twice changes nothing the second time
    assert not again.created and "younger" in again.reason
    assert again.active.kid == rotation.active.kid
    assert SigningKey.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_rotations_leave_exactly_one_active_key():
    signing_key_ensure()
    errors = []

    def rotate():
        try:
            signing_key_rotate()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    run_threads(rotate, [()] * 4, timeout=30)
    assert not errors
    assert SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).count() == 1
    assert SigningKey.objects.filter(status=SigningKey.Status.PUBLISHED).count() == 4


def test_rotate_signing_key_command(capsys):
    old = signing_key_ensure()
    call_command("rotate_signing_key")
    out = capsys.readouterr().out
    new = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    old.refresh_from_db()
    assert new.kid != old.kid and f"Signing key {new.kid} is active" in out
    assert old.kid in out and old.retire_after.isoformat() in out
    assert "PRIVATE" not in out


# --------------------------------------------------------------------------- beat schedule


def test_monthly_beat_schedule_exists_and_runs_the_real_task():
    periodic = PeriodicTask.objects.get(task="gshare.signing_key_rotate")
    assert periodic.enabled and periodic.interval is None
    crontab = periodic.crontab
    assert (crontab.minute, crontab.hour, crontab.day_of_month, crontab.month_of_year, crontab.day_of_week) == ("0", "3", "1", "*", "*")
    assert str(crontab.timezone) == "UTC"
    assert 0 < periodic.expire_seconds <= 28 * 24 * 3600  # expires no later than its interval

    old = signing_key_ensure()
    token = sign_internal_jwt("operator:clu_abc", 600)
    SigningKey.objects.filter(pk=old.pk).update(created_at=timezone.now() - SCHEDULED_ROTATION_MIN_AGE - SECOND)
    result = app.tasks[periodic.task].delay().get()
    assert result["rotated"] and result["replaced"] == [old.kid]
    assert kid_of(sign_internal_jwt("operator:clu_abc", 600)) == result["active"] != old.kid
    assert verify_internal_jwt(token, OPERATOR_AUDIENCE)
    second = app.tasks[periodic.task].delay().get()  # a second run in the same month changes nothing
    assert not second["rotated"] and second["active"] == result["active"]


def test_the_monthly_task_retires_keys_past_their_retire_time():
    old = signing_key_ensure()
    signing_key_rotate(now=long_ago())
    result = tasks.signing_key_rotate.delay().get()
    assert result["retired"] == [old.kid]
    assert SigningKey.objects.get(pk=old.pk).status == SigningKey.Status.RETIRED


def test_daily_retire_schedule_exists_and_runs_the_real_task():
    periodic = PeriodicTask.objects.get(task="gshare.signing_keys_retire")
    assert periodic.enabled and periodic.crontab.day_of_month == "*" and periodic.expire_seconds <= 24 * 3600
    old = signing_key_ensure()
    signing_key_rotate(now=long_ago())
    assert app.tasks[periodic.task].delay().get() == [old.kid]
    assert app.tasks[periodic.task].delay().get() == []


# --------------------------------------------------------------------------- import


@pytest.mark.parametrize(
    ("fmt", "marker"),
    [(serialization.PrivateFormat.TraditionalOpenSSL, b"BEGIN RSA PRIVATE KEY"), (serialization.PrivateFormat.PKCS8, b"BEGIN PRIVATE KEY")],
    ids=["pkcs1", "pkcs8"],
)
def test_import_makes_the_key_active_and_keeps_the_previous_one_verifying(tmp_path, capsys, fmt, marker):
    previous = signing_key_ensure()
    old_token = sign_internal_jwt("operator:clu_abc", 600)
    pem = rsa_pem(3072, fmt)
    assert marker in pem
    out, err = import_command(tmp_path, pem, capsys)
    active = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    assert active.imported and active.kid != previous.kid and "Imported" in out and active.kid in out
    assert_no_key_material(out + err, pem)
    previous.refresh_from_db()
    assert previous.status == SigningKey.Status.PUBLISHED and previous.retire_after > timezone.now() + timedelta(days=29)
    new_token = sign_internal_jwt("operator:clu_abc", 600)
    assert kid_of(new_token) == active.kid
    public = serialization.load_pem_private_key(pem, password=None).public_key()
    assert jwt.decode(new_token, public, algorithms=["RS256"], audience=OPERATOR_AUDIENCE)["sub"] == "operator:clu_abc"
    assert verify_internal_jwt(old_token, OPERATOR_AUDIENCE)
    assert jwks_kids() == {previous.kid, active.kid}


def test_import_is_idempotent(tmp_path, capsys):
    pem = rsa_pem()
    import_command(tmp_path, pem, capsys)
    keys_before = list(SigningKey.objects.values_list("kid", "status", "retire_after").order_by("kid"))
    out, err = import_command(tmp_path, pem, capsys)
    assert out.startswith("No change") and "already on record" in out
    assert_no_key_material(out + err, pem)
    assert list(SigningKey.objects.values_list("kid", "status", "retire_after").order_by("kid")) == keys_before
    # The same key in the other PEM format is the same key.
    pkcs1 = serialization.load_pem_private_key(pem, None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    assert not signing_key_import(pkcs1).created


def test_scheduled_rotation_leaves_an_imported_key_alone(tmp_path, capsys):
    import_command(tmp_path, rsa_pem(), capsys)
    imported = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    later = imported.created_at + SCHEDULED_ROTATION_MIN_AGE + timedelta(days=10)
    rotation = signing_key_rotate_scheduled(now=later)
    assert not rotation.created and "imported" in rotation.reason
    assert SigningKey.objects.get(status=SigningKey.Status.ACTIVE).kid == imported.kid


def _pem_of(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: rsa_pem(1024), "1024 bits"),
        (lambda: _pem_of(ec.generate_private_key(ec.SECP256R1())), "elliptic-curve"),
        (lambda: rsa_pem(2048, password=b"s3cret"), "encrypted"),
        (lambda: rsa_pem(2048, serialization.PrivateFormat.TraditionalOpenSSL, password=b"s3cret"), "encrypted"),
        (lambda: rsa.generate_private_key(65537, 2048).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), "no PEM private key"),
        (lambda: b"not a key at all", "not PEM"),
        (lambda: b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "no PEM private key"),
        (lambda: b"A" * (70 * 1024), "larger than"),
    ],
    ids=["rsa-1024", "ec", "pkcs8-encrypted", "pkcs1-encrypted", "public-key", "garbage", "bad-pem", "huge"],
)
def test_import_refuses_what_is_not_an_unencrypted_rsa_key_of_2048_bits(tmp_path, capsys, make, message):
    before = signing_key_ensure()
    pem = make()
    with pytest.raises(CommandError) as refused:
        import_command(tmp_path, pem, capsys)
    assert refused.value.returncode == 1
    text = str(refused.value)
    assert text.startswith("signing_key_invalid:") and message in text and "openssl genpkey" in text
    assert_no_key_material(text + capsys.readouterr().out, pem)
    assert list(SigningKey.objects.values_list("kid", flat=True)) == [before.kid]


def test_import_of_a_missing_file_is_refused(tmp_path):
    with pytest.raises(CommandError, match="signing_key_invalid: cannot read") as refused:
        call_command("import_signing_key", "--file", str(tmp_path / "absent.pem"))
    assert refused.value.returncode == 1


def test_import_of_a_retired_key_changes_nothing_and_says_so(tmp_path, capsys):
    pem = rsa_pem()
    import_command(tmp_path, pem, capsys)
    imported = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    active = signing_key_rotate(now=long_ago()).active
    assert imported.kid in signing_keys_retire()
    out, _ = import_command(tmp_path, pem, capsys)  # exit 0: the Helm migrate Job keeps working
    assert f"already on record as {imported.kid}, retired since" in out and "not reactivated" in out
    assert SigningKey.objects.get(pk=imported.pk).status == SigningKey.Status.RETIRED
    assert SigningKey.objects.get(status=SigningKey.Status.ACTIVE).pk == active.pk


def test_system_check_refuses_a_token_lifetime_above_the_rotation_bound(settings):
    from identity.checks import token_lifetimes_within_key_rotation_bound

    assert token_lifetimes_within_key_rotation_bound(None) == []
    settings.GSHARE_CONNECT_COOKIE_TTL = MAX_TOKEN_TTL + 1
    errors = token_lifetimes_within_key_rotation_bound(None)
    assert [e.id for e in errors] == ["gshare.E001"] and "GSHARE_CONNECT_COOKIE_TTL" in errors[0].msg
