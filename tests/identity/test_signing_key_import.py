"""Signing key import: re-importing a key already on record succeeds whatever its state (so the
Helm chart's migrate Job keeps working after a manual rotation), and RSA keys with a public exponent other than
65537 are refused.
"""

from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.management import CommandError, call_command
from django.utils import timezone

from identity.keys import signing_key_ensure, signing_key_import, signing_key_retire_time, signing_key_rotate, signing_keys_retire
from identity.models import SigningKey

pytestmark = pytest.mark.django_db


def rsa_pem(exponent: int = 65537, bits: int = 2048) -> bytes:
    key = rsa.generate_private_key(public_exponent=exponent, key_size=bits)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())


def long_ago():
    now = timezone.now()
    return now - (signing_key_retire_time(now) - now) - timedelta(seconds=1)


def run_import(tmp_path, pem: bytes, capsys) -> str:
    path = tmp_path / "private-key.pem"
    path.write_bytes(pem)
    call_command("import_signing_key", "--file", str(path))
    return capsys.readouterr().out


def test_helm_key_plus_a_manual_rotation_does_not_block_later_upgrades(tmp_path, capsys):
    """The chart imports its key on every upgrade; someone rotates by hand; 30 days on
    the key is retired and the next ``helm upgrade`` must still succeed."""
    pem = rsa_pem()
    assert "Imported: signing key" in run_import(tmp_path, pem, capsys)
    helm_key = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    assert "is the active signing key" in run_import(tmp_path, pem, capsys)  # an upgrade without a rotation

    generated = signing_key_rotate(now=long_ago()).active  # a `rotate_signing_key` by hand, long ago
    out = run_import(tmp_path, pem, capsys)  # an upgrade before the retirement: published
    assert f"already on record as {helm_key.kid}, replaced and only verifying tokens until" in out and "not reactivated" in out

    assert helm_key.kid in signing_keys_retire()
    retired = SigningKey.objects.get(pk=helm_key.pk)
    out = run_import(tmp_path, pem, capsys)  # the upgrade 30 days later: exit 0, says what state the key is in
    assert out.startswith("No change: ")
    assert f"already on record as {helm_key.kid}, retired since {retired.retired_at.isoformat()}: not reactivated" in out
    assert "import a new key" in out and f"the active signing key is {generated.kid}" in out
    assert "PRIVATE KEY" not in out
    assert SigningKey.objects.get(pk=helm_key.pk).status == SigningKey.Status.RETIRED
    assert SigningKey.objects.get(status=SigningKey.Status.ACTIVE).kid == generated.kid

    # A new key of one's own still takes over.
    assert "Imported: signing key" in run_import(tmp_path, rsa_pem(), capsys)


def test_reimport_service_reports_the_state_and_changes_nothing():
    pem = rsa_pem()
    first = signing_key_import(pem)
    again = signing_key_import(pem)
    assert (again.created, again.active.kid) == (False, first.active.kid)
    assert "is the active signing key" in again.reason
    assert SigningKey.objects.count() == 1


def test_a_key_with_exponent_3_is_refused(tmp_path, capsys):
    before = signing_key_ensure()
    with pytest.raises(CommandError) as refused:
        run_import(tmp_path, rsa_pem(exponent=3), capsys)
    assert refused.value.returncode == 1
    text = str(refused.value)
    assert text.startswith("signing_key_invalid: ") and "public exponent is 3" in text and "65537" in text
    assert list(SigningKey.objects.values_list("kid", flat=True)) == [before.kid]


def test_a_key_of_another_algorithm_is_refused_by_name():
    """The refusal names the algorithm, DSA included, without the module importing cryptography's deprecated DSA."""
    import warnings

    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519

    from identity.keys import SigningKeyInvalid

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # building the DSA key under test is what warns, not the control plane
        from cryptography.hazmat.primitives.asymmetric import dsa

        keys = {"a DSA key": dsa.generate_private_key(2048), "an elliptic-curve key": ec.generate_private_key(ec.SECP256R1()),
                "an Ed25519 key": ed25519.Ed25519PrivateKey.generate(), "a X25519 key": x25519.X25519PrivateKey.generate()}
    for kind, key in keys.items():
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        with pytest.raises(SigningKeyInvalid, match=f"The private key is {kind}, not RSA"):
            signing_key_import(pem)
