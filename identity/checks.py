"""System checks of the gshare app (``manage.py check``; run before ``migrate`` and ``runserver``)."""

from django.conf import settings
from django.core.checks import Error, register

#: Settings holding the lifetime of a kind of internal JWT, seconds.
TOKEN_TTL_SETTINGS = ("GSHARE_OPERATOR_TOKEN_TTL", "GSHARE_CONNECT_TOKEN_TTL", "GSHARE_CONNECT_COOKIE_TTL")


@register()
def token_lifetimes_within_key_rotation_bound(app_configs, **kwargs) -> list[Error]:
    """Every internal JWT lifetime setting is at most ``MAX_TOKEN_TTL`` (30 days).

    Signing key rotation keeps a replaced key published for that long; ``sign_internal_jwt`` refuses
    a longer ``ttl``, so a larger setting would make every such signature fail.
    """
    from identity.keys import MAX_TOKEN_TTL  # keys imports the models; checks are registered before they load

    errors = []
    for name in TOKEN_TTL_SETTINGS:
        value = getattr(settings, name, None)
        if isinstance(value, int) and not 0 < value <= MAX_TOKEN_TTL:
            errors.append(Error(
                f"{name} is {value} s; internal JWT lifetimes must be between 1 and {MAX_TOKEN_TTL} s (30 days).",
                hint=f"Set {name} to at most {MAX_TOKEN_TTL}: signing key rotation keeps a replaced key for that long.",
                id="gshare.E001",
            ))
    return errors
