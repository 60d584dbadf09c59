"""The console's display settings: datetimes with their zone (``2026-12-01 11:30 UTC``), ISO dates."""

from decimal import Decimal, InvalidOperation

from django.core.exceptions import ImproperlyConfigured

from .env import env

#: ``gshare/formats/<lang>/formats.py`` override Django's locale formats for the console's pages.
FORMAT_MODULE_PATH = ["gshare.formats"]

#: The dashboard's credits tile counts the accounts whose balance is below this many credits (a Decimal).
try:
    GSHARE_CONSOLE_LOW_BALANCE = Decimal(env.str("GSHARE_CONSOLE_LOW_BALANCE", default="10"))
except InvalidOperation:
    GSHARE_CONSOLE_LOW_BALANCE = Decimal("NaN")
if not GSHARE_CONSOLE_LOW_BALANCE.is_finite():
    raise ImproperlyConfigured("GSHARE_CONSOLE_LOW_BALANCE must be a number of credits, e.g. 10 or 2.5.")

#: Seconds the console may reuse a slow read across requests (``console.reuse``): the dashboard's 24-hour chart
#: and credits and storage tiles (its counts are always read live), GPU management's totals when nothing narrows the
#: list. 0 turns the reuse off.
GSHARE_CONSOLE_CACHE_SECONDS = env.int("GSHARE_CONSOLE_CACHE_SECONDS", default=3)
