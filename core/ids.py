"""Public ids: a type prefix and 16 random base32 characters (``clu_x7k2...``)."""

from __future__ import annotations

import secrets

_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
ID_LENGTH = 16


def new_public_id(prefix: str) -> str:
    """Return ``<prefix>_<16 random lowercase base32 chars>`` (80 bits from ``secrets``)."""
    return f"{prefix}_" + "".join(secrets.choice(_ALPHABET) for _ in range(ID_LENGTH))



def new_cluster_id() -> str:
    """Default for ``Cluster.public_id`` (``clu_...``)."""
    return new_public_id("clu")


def new_session_id() -> str:
    """Default for ``Session.public_id`` (``ses_...``)."""
    return new_public_id("ses")


def new_volume_id() -> str:
    """Default for ``Volume.public_id`` (``vol_...``)."""
    return new_public_id("vol")


def new_pool_id() -> str:
    """Default for ``StoragePool.public_id`` (``pool_...``)."""
    return new_public_id("pool")

