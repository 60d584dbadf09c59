"""Encryption at rest: first key encrypts, every key decrypts, rotation re-encrypts."""

import pytest
from cryptography.fernet import Fernet, InvalidToken

from gshare.crypto import decrypt_text, encrypt_text, rotate_text


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
