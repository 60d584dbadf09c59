"""Services for the RS256 signing keys of internal JWTs (stored in ``gshare.SigningKey``).

Rotation without refusing a valid token: when a key stops signing (a rotation or an import replaces
it) it stays published, verify-only, until ``retire_after``, the latest moment a token it signed can
still be accepted:

    retire_after = when it stopped signing + MAX_TOKEN_TTL + GSHARE_JWT_LEEWAY + IN_FLIGHT_MARGIN

``MAX_TOKEN_TTL`` bounds every internal JWT (``sign_internal_jwt`` refuses a longer ``ttl``), so the
bound holds for operator tokens (at most 30 days), connect links and connect cookies alike, without a
database write per signature. ``IN_FLIGHT_MARGIN`` covers a signer that read the active key just
before a rotation committed. After ``retire_after`` the key is left out of the JWKS and refused by
verification at once; ``signing_keys_retire`` (beat: daily, and with every scheduled rotation) then
marks it ``retired``.

Every change of which key is active is serialised by one PostgreSQL advisory lock (``_KEY_LOCK_ID``),
the one ``signing_key_ensure`` takes before creating the first key, so there is never more than one
active key.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.services import Action, audit_record
from core.exceptions import ApplicationError
from identity.errors import SIGNING_KEY_INVALID
from identity.models import SigningKey

logger = logging.getLogger(__name__)

# A fixed advisory-lock id so two processes never both create "the first" key, or rotate at once.
_KEY_LOCK_ID = 0x6753_4B45  # "gSKE"

#: Longest lifetime of any internal JWT, seconds (30 days: operator tokens' maximum; connect links
#: and cookies live minutes to hours). ``sign_internal_jwt`` refuses a longer ``ttl``.
MAX_TOKEN_TTL = 30 * 24 * 3600
#: Extra time a replaced key stays published, for a token signed by a process that read the key
#: just before the rotation committed.
IN_FLIGHT_MARGIN = timedelta(minutes=5)
#: The scheduled (monthly) rotation replaces the active key only when it is at least this old, so a
#: repeated or late run changes nothing (shorter than the shortest month).
SCHEDULED_ROTATION_MIN_AGE = timedelta(days=25)
#: Largest key file ``signing_key_import`` reads, bytes (a 16384-bit RSA PEM is about 12 KiB).
MAX_KEY_FILE_BYTES = 64 * 1024
MIN_IMPORT_BITS = 2048
#: The only RSA public exponent accepted on import (what every current tool generates; e=3 and other small
#: exponents are refused: they invite signature-forgery bugs in verifiers).
IMPORT_PUBLIC_EXPONENT = 65537


class SigningKeyInvalid(ApplicationError):
    """400: the supplied private key cannot be imported (not PEM, encrypted, not RSA, too small, exponent not 65537)."""

    code = SIGNING_KEY_INVALID
    status = 400


@dataclass
class Rotation:
    """What a rotation, an import or a retirement run changed.

    Attributes:
        active: the active key afterwards.
        created: True when ``active`` is new (False: nothing was rotated or imported).
        replaced: keys that stopped signing now (status ``published``, ``retire_after`` set).
        retired: kids of the keys marked ``retired`` by this call.
        reason: why nothing was rotated, when ``created`` is False ("" otherwise).
    """

    active: SigningKey
    created: bool
    replaced: list[SigningKey] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    reason: str = ""


def _generate_key_pair() -> tuple[str, str]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=settings.GSHARE_JWT_KEY_BITS)
    return _pem_pair(private)


def _pem_pair(private: rsa.RSAPrivateKey) -> tuple[str, str]:
    """``(PKCS#8 private PEM, SubjectPublicKeyInfo public PEM)`` of ``private``; deterministic for one key."""
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return private_pem, public_pem


def _replaced_facts(replaced: list[SigningKey]) -> dict:
    """Audit details of a rotation or an import: the kids that stopped signing and until when they verify."""
    return {"replaced": [old.kid for old in replaced], "verify_until": replaced[0].retire_after if replaced else None}


def _lock() -> None:
    """Take the signing-key advisory lock until the end of the current transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_KEY_LOCK_ID])


def _active() -> SigningKey | None:
    return SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).order_by("-created_at").first()


def signing_key_retire_time(stopped_at: datetime) -> datetime:
    """Return when a key that stopped signing at ``stopped_at`` may be retired.

    Args:
        stopped_at: timezone-aware moment the key stopped signing (UTC).

    Returns:
        ``stopped_at + MAX_TOKEN_TTL + GSHARE_JWT_LEEWAY + IN_FLIGHT_MARGIN`` (timezone-aware): every token
        the key signed has expired, leeway included, by then.
    """
    return stopped_at + timedelta(seconds=MAX_TOKEN_TTL + settings.GSHARE_JWT_LEEWAY) + IN_FLIGHT_MARGIN


def signing_keys_published(now: datetime | None = None) -> QuerySet[SigningKey]:
    """The keys that verify tokens at ``now``: active, or published and not past ``retire_after``.

    Args:
        now: the moment to evaluate (default: now, UTC).

    Returns:
        A queryset of ``SigningKey`` (newest first).
    """
    now = now or timezone.now()
    return (
        SigningKey.objects.filter(status__in=[SigningKey.Status.ACTIVE, SigningKey.Status.PUBLISHED])
        .filter(Q(retire_after__isnull=True) | Q(retire_after__gt=now))
        .order_by("-created_at")
    )


@transaction.atomic
def signing_key_ensure() -> SigningKey:
    """Return the active signing key, creating the first one if there is none.

    Serialised with a PostgreSQL advisory lock, so concurrent first calls create one key.

    Returns:
        The newest ``SigningKey`` with status ``active``.
    """
    key = _active()
    if key is not None:
        return key
    _lock()
    key = _active()
    if key is not None:
        return key
    return signing_key_create()


def _replace_active(new: SigningKey, now: datetime) -> list[SigningKey]:
    """Make ``new`` (unsaved) the one active key; earlier active keys become published with
    ``retire_after``. Call under the advisory lock, in a transaction."""
    replaced = list(SigningKey.objects.select_for_update().filter(status=SigningKey.Status.ACTIVE))
    retire_after = signing_key_retire_time(now)
    for old in replaced:
        old.status = SigningKey.Status.PUBLISHED
        old.retire_after = retire_after
        old.save(update_fields=["status", "retire_after"])
    new.full_clean()
    new.save()
    return replaced


@transaction.atomic
def signing_key_create(*, now: datetime | None = None) -> SigningKey:
    """Create a new active signing key; earlier active keys become ``published`` (verify only) until
    ``signing_key_retire_time(now)``.

    Args:
        now: the moment the earlier keys stop signing (default: now, UTC).

    Returns:
        The new ``SigningKey``; its ``kid`` is 16 random hex characters.
    """
    return signing_key_rotate(now=now).active


@transaction.atomic
def signing_key_rotate(*, now: datetime | None = None) -> Rotation:
    """Generate a new RSA key (``GSHARE_JWT_KEY_BITS``) and make it the active signing key.

    New tokens carry the new ``kid``. The previous active key stays published (JWKS, verification)
    until ``signing_key_retire_time(now)``; keys already past their ``retire_after`` are retired.

    Args:
        now: the moment of the rotation (default: now, UTC).

    Returns:
        A ``Rotation`` (``created`` True).
    """
    now = now or timezone.now()
    private_pem, public_pem = _generate_key_pair()  # before the lock: generating takes a while
    _lock()
    key = SigningKey(kid=secrets.token_hex(8), private_key_pem=private_pem, public_key_pem=public_pem, created_at=now)
    replaced = _replace_active(key, now)
    retired = signing_keys_retire(now=now)
    if replaced:
        logger.info(
            "signing key rotated: %s is active; %s verify until %s",
            key.kid, ", ".join(k.kid for k in replaced), replaced[0].retire_after.isoformat(),
        )
    audit_record(action=Action.SIGNING_KEY_ROTATE, obj=key, changes={"status": (None, key.status)}, details=_replaced_facts(replaced))
    return Rotation(active=key, created=True, replaced=replaced, retired=retired)


@transaction.atomic
def signing_key_rotate_scheduled(*, now: datetime | None = None) -> Rotation:
    """The scheduled (monthly) rotation: rotate unless the active key is young or was imported.

    Idempotent: it rotates only when the active key is older than ``SCHEDULED_ROTATION_MIN_AGE``, so a
    second run (or a late one) changes nothing. An imported active key (``manage.py import_signing_key``)
    is left alone: whoever supplies the key rotates it by supplying a new one. Keys past their
    ``retire_after`` are retired in every case.

    Args:
        now: the moment of the run (default: now, UTC).

    Returns:
        A ``Rotation``; ``created`` False with ``reason`` when nothing was rotated.
    """
    now = now or timezone.now()
    _lock()
    active = _active()
    if active is None:
        return signing_key_rotate(now=now)
    reason = ""
    if active.imported:
        reason = f"the active key {active.kid} was imported (manage.py import_signing_key); supply a new key to rotate it"
    elif now - active.created_at < SCHEDULED_ROTATION_MIN_AGE:
        reason = f"the active key {active.kid} is younger than {SCHEDULED_ROTATION_MIN_AGE.days} days"
    if reason:
        return Rotation(active=active, created=False, retired=signing_keys_retire(now=now), reason=reason)
    return signing_key_rotate(now=now)


def signing_keys_retire(*, now: datetime | None = None) -> list[str]:
    """Retire every published key whose ``retire_after`` has passed (idempotent).

    A published key without ``retire_after`` (replaced before it was recorded) gets
    ``signing_key_retire_time(now)``, the safe bound from now.

    Args:
        now: the moment to evaluate (default: now, UTC).

    Returns:
        The kids retired by this call (empty when nothing was due).
    """
    now = now or timezone.now()
    published = SigningKey.objects.filter(status=SigningKey.Status.PUBLISHED)
    published.filter(retire_after__isnull=True).update(retire_after=signing_key_retire_time(now))
    with transaction.atomic():
        due = list(published.select_for_update().filter(retire_after__lte=now).values_list("pk", "kid"))
        SigningKey.objects.filter(pk__in=[pk for pk, _ in due]).update(status=SigningKey.Status.RETIRED, retired_at=now)
        for _, kid in due:
            audit_record(action=Action.SIGNING_KEY_RETIRE, object_type="signing_key", object_id=kid,
                         changes={"status": (SigningKey.Status.PUBLISHED, SigningKey.Status.RETIRED)}, details={"retired_at": now})
    kids = [kid for _, kid in due]
    if kids:
        logger.info("signing keys retired (every token they signed has expired): %s", ", ".join(kids))
    return kids


# DSA is named from the key's class (``DSAPrivateKey``) below: touching cryptography's ``dsa`` module warns
# (CryptographyDeprecationWarning) in every process that imports this one.
_KEY_KINDS = ((ec.EllipticCurvePrivateKey, "an elliptic-curve key"), (ed25519.Ed25519PrivateKey, "an Ed25519 key"),
              (ed448.Ed448PrivateKey, "an Ed448 key"))


def _key_kind(key: object) -> str:
    """``an Ed25519 key``, ``a DSA key``, ``a X25519 key``: what a non-RSA private key is, for the refusal."""
    known = next((name for cls, name in _KEY_KINDS if isinstance(key, cls)), None)
    return known or f"a {type(key).__name__.removesuffix('PrivateKey') or 'non-RSA'} key"


def _load_rsa_private_key(pem: bytes) -> rsa.RSAPrivateKey:
    """Parse an unencrypted PKCS#1 or PKCS#8 PEM RSA private key of at least ``MIN_IMPORT_BITS``, public exponent 65537.

    Raises:
        SigningKeyInvalid: with a sentence naming the problem and the fix (never the key's content).
    """
    fix = (
        "Supply an unencrypted RSA private key of at least 2048 bits in PEM, e.g. "
        "`openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:3072 -out signing-key.pem`."
    )
    if len(pem) > MAX_KEY_FILE_BYTES:
        raise SigningKeyInvalid(f"The key file is larger than {MAX_KEY_FILE_BYTES} bytes, too large for one private key. {fix}")
    if b"-----BEGIN" not in pem:
        raise SigningKeyInvalid(f"The file is not PEM (no `-----BEGIN` line). {fix}")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # cryptography's answer to an encrypted key (PKCS#8 or PKCS#1 with a passphrase) and no password
        raise SigningKeyInvalid(f"The private key is encrypted with a passphrase; the import needs it unencrypted. {fix}") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        hint = " (an OpenSSH key: convert it with `ssh-keygen -p -m PEM`)" if b"OPENSSH" in pem else ""
        raise SigningKeyInvalid(f"The file holds no PEM private key this control plane can read ({type(exc).__name__}){hint}. {fix}") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise SigningKeyInvalid(f"The private key is {_key_kind(key)}, not RSA; internal JWTs are RS256. {fix}")
    if key.key_size < MIN_IMPORT_BITS:
        raise SigningKeyInvalid(f"The RSA key has {key.key_size} bits; at least {MIN_IMPORT_BITS} are required. {fix}")
    exponent = key.private_numbers().public_numbers.e
    if exponent != IMPORT_PUBLIC_EXPONENT:
        raise SigningKeyInvalid(f"The RSA key's public exponent is {exponent}; only {IMPORT_PUBLIC_EXPONENT} is accepted. {fix}")
    return key


def _on_record(key: SigningKey) -> str:
    """Why importing ``key`` again changes nothing, by its status (a clause, no final period)."""
    fix = "not reactivated; to make another key active, import a new key (`openssl genpkey ...`, docs/rotation.md)"
    if key.status == SigningKey.Status.ACTIVE:
        return f"this key is already on record as {key.kid} and is the active signing key"
    if key.status == SigningKey.Status.RETIRED:
        since = key.retired_at.isoformat() if key.retired_at else "an unknown date"
        return f"this key is already on record as {key.kid}, retired since {since}: {fix}"
    until = f" until {key.retire_after.isoformat()}" if key.retire_after else ""
    return f"this key is already on record as {key.kid}, replaced and only verifying tokens{until}: {fix}"


@transaction.atomic
def signing_key_import(pem: bytes | str, *, now: datetime | None = None) -> Rotation:
    """Make a supplied RSA private key the active signing key (idempotent).

    Args:
        pem: the key as PEM, PKCS#1 (traditional OpenSSL) or PKCS#8, unencrypted, RSA of at least 2048 bits. Stored as PKCS#8, encrypted at rest.
        now: the moment the previous active key stops signing (default: now, UTC).

    Returns:
        A ``Rotation``: ``created`` True with the new active key and the ``replaced`` key(s) (published,
        ``retire_after`` set); or ``created`` False, nothing changed, when the key is already on record in
        any status, with ``reason`` saying which (:func:`_on_record`). A published or retired key is never
        made active again (it was replaced; tokens it signed may have been refused): to change the
        active key, import a new one. So the Helm chart's migrate Job can run the import on every upgrade
        with the key from its Secret, whatever happened to that key since.

    Raises:
        SigningKeyInvalid: ``signing_key_invalid`` (not PEM, encrypted, not RSA, under 2048 bits, public
            exponent other than 65537).
    """
    now = now or timezone.now()
    private = _load_rsa_private_key(pem.encode() if isinstance(pem, str) else pem)
    private_pem, public_pem = _pem_pair(private)
    _lock()
    existing = SigningKey.objects.filter(public_key_pem=public_pem).first()
    if existing is not None:
        active = _active() or existing
        return Rotation(active=active, created=False, reason=_on_record(existing))
    key = SigningKey(kid=secrets.token_hex(8), private_key_pem=private_pem, public_key_pem=public_pem, imported=True, created_at=now)
    replaced = _replace_active(key, now)
    logger.info("signing key imported: %s (%d bits) is active; replaced %s", key.kid, private.key_size, ", ".join(k.kid for k in replaced) or "none")
    audit_record(action=Action.SIGNING_KEY_IMPORT, obj=key, changes={"status": (None, key.status)},
                 details={**_replaced_facts(replaced), "bits": private.key_size})
    return Rotation(active=key, created=True, replaced=replaced)
