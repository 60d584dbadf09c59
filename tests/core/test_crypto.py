"""Encryption at rest: first key encrypts, every key decrypts, rotation re-encrypts."""

import pytest
from cryptography.fernet import Fernet, InvalidToken

from core.crypto import decrypt_text, encrypt_text, rotate_text


def test_first_key_encrypts_all_decrypt(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GSHARE_ENCRYPTION_KEYS = [old]
    token = encrypt_text("kubeconfig-secret")
    assert "kubeconfig-secret" not in token
    settings.GSHARE_ENCRYPTION_KEYS = [new, old]
    assert decrypt_text(token) == "kubeconfig-secret"
    rotated = rotate_text(token)
    settings.GSHARE_ENCRYPTION_KEYS = [new]
    assert decrypt_text(rotated) == "kubeconfig-secret"
    with pytest.raises(InvalidToken):
        decrypt_text(token)


@pytest.mark.django_db
def test_rotate_encryption_keys_rewrites_every_secret(settings):
    from io import StringIO

    from django.core.management import call_command
    from django.db import connection

    from clusters.models import Cluster
    from identity.keys import signing_key_ensure
    from tests.factories import ClusterFactory

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GSHARE_ENCRYPTION_KEYS = [old]
    cluster = ClusterFactory()
    signing_key_ensure()
    settings.GSHARE_ENCRYPTION_KEYS = [new, old]
    out = StringIO()
    call_command("rotate_encryption_keys", stdout=out)
    assert "clusters.Cluster.kubeconfig: 1" in out.getvalue()
    settings.GSHARE_ENCRYPTION_KEYS = [new]
    assert "factory-token" in Cluster.objects.get(pk=cluster.pk).kubeconfig
    with connection.cursor() as cursor:
        cursor.execute("SELECT kubeconfig FROM clusters_cluster")
        assert "factory-token" not in cursor.fetchone()[0]
