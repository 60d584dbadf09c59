"""Billing settings (billing/): the fallback price and the usage-ingestion limits. See docs/billing.md."""

from decimal import Decimal, InvalidOperation

from django.core.exceptions import ImproperlyConfigured

import contract

from .env import env

#: Credits per GPU-hour for a GPU model that has no ``Price`` row when there is no default row (``gpu_model`` "")
#: either. A decimal string (never a float): at least 0, at most 6 decimal places.
try:
    GSHARE_BILLING_DEFAULT_PRICE = Decimal(env.str("GSHARE_BILLING_DEFAULT_PRICE", default="1.0"))
except InvalidOperation:
    GSHARE_BILLING_DEFAULT_PRICE = None
if (
    GSHARE_BILLING_DEFAULT_PRICE is None
    or not GSHARE_BILLING_DEFAULT_PRICE.is_finite()
    or GSHARE_BILLING_DEFAULT_PRICE < 0
    or GSHARE_BILLING_DEFAULT_PRICE != GSHARE_BILLING_DEFAULT_PRICE.quantize(Decimal("0.000001"))
    or GSHARE_BILLING_DEFAULT_PRICE >= Decimal(10) ** 12
):
    raise ImproperlyConfigured(
        "GSHARE_BILLING_DEFAULT_PRICE must be a decimal number of credits per GPU-hour, at least 0, with at most 6 decimal "
        "places (e.g. 1.0)."
    )
#: Longest usage-sample window (``end - start``) ``POST /internal/v1/usage`` accepts, seconds (default: the
#: operator's own limit, ``contract.USAGE_MAX_WINDOW_SECONDS``).
GSHARE_USAGE_MAX_WINDOW_SECONDS = env.int("GSHARE_USAGE_MAX_WINDOW_SECONDS", default=contract.USAGE_MAX_WINDOW_SECONDS)
#: Oldest usage window accepted, seconds before now (an operator's queue may hold samples from an outage).
GSHARE_USAGE_MAX_AGE_SECONDS = env.int("GSHARE_USAGE_MAX_AGE_SECONDS", default=30 * 86400)
if GSHARE_USAGE_MAX_WINDOW_SECONDS < 1:
    raise ImproperlyConfigured("GSHARE_USAGE_MAX_WINDOW_SECONDS must be a whole number of seconds, at least 1.")
#: Length of a billing period, seconds (periods are aligned to the Unix epoch: with 3600, whole UTC hours). The ledger
#: gets one charge per session and period (billing/periods.py).
GSHARE_BILLING_PERIOD_SECONDS = env.int("GSHARE_BILLING_PERIOD_SECONDS", default=3600)
#: How long after a period ends (or its session ended) the periodic close waits for late samples before charging it.
GSHARE_BILLING_SETTLE_SECONDS = env.int("GSHARE_BILLING_SETTLE_SECONDS", default=120)
if GSHARE_BILLING_PERIOD_SECONDS < 1 or GSHARE_BILLING_SETTLE_SECONDS < 0:
    raise ImproperlyConfigured("GSHARE_BILLING_PERIOD_SECONDS must be a whole number of seconds, at least 1, and "
                               "GSHARE_BILLING_SETTLE_SECONDS at least 0.")

# Admission and stopping (billing/admission.py) when no Policy row applies to a user (neither their own nor the default
# row): the minimum balance to start, in hours of the requested resources, and the grace before an account below
# zero has its sessions stopped.
try:
    GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = Decimal(env.str("GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS", default="1"))
except InvalidOperation:
    GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = None
if GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS is None or not GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS.is_finite() or GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS < 0:
    raise ImproperlyConfigured("GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS must be a decimal number of hours, at least 0 (e.g. 1).")
GSHARE_BILLING_DEFAULT_GRACE_SECONDS = env.int("GSHARE_BILLING_DEFAULT_GRACE_SECONDS", default=900)

# The idle policy (sessions/idle.py, docs/idle.md) when no Policy row applies, and how long one of its minutes lasts:
# 60 s, except in the demo (`make demo DEMO_ARGS="--idle-timeout 60"` makes a policy minute last one second).
GSHARE_BILLING_DEFAULT_IDLE_TIMEOUT_MINUTES = env.int("GSHARE_BILLING_DEFAULT_IDLE_TIMEOUT_MINUTES", default=60)
GSHARE_BILLING_DEFAULT_IDLE_WARNING_MINUTES = env.int("GSHARE_BILLING_DEFAULT_IDLE_WARNING_MINUTES", default=15)
GSHARE_IDLE_POLICY_MINUTE_SECONDS = env.int("GSHARE_IDLE_POLICY_MINUTE_SECONDS", default=60)
#: An operator's activity reading older than this (seconds) no longer counts: the session's GPU activity is unknown.
GSHARE_ACTIVITY_STALE_SECONDS = env.int("GSHARE_ACTIVITY_STALE_SECONDS", default=300)
if GSHARE_BILLING_DEFAULT_IDLE_TIMEOUT_MINUTES < 0 or GSHARE_BILLING_DEFAULT_IDLE_WARNING_MINUTES < 0:
    raise ImproperlyConfigured("GSHARE_BILLING_DEFAULT_IDLE_TIMEOUT_MINUTES and _IDLE_WARNING_MINUTES must be whole numbers of minutes, at least 0.")
if GSHARE_IDLE_POLICY_MINUTE_SECONDS < 1 or GSHARE_ACTIVITY_STALE_SECONDS < 1:
    raise ImproperlyConfigured("GSHARE_IDLE_POLICY_MINUTE_SECONDS and GSHARE_ACTIVITY_STALE_SECONDS must be whole numbers of seconds, at least 1.")

# The session time limit (sessions/runtime.py, docs/sessions.md "Time limits") when no Policy row applies: hours from a
# session's reservation (0: no limit; at most 8760, 2 decimal places) and the warning's minutes before it.
try:
    GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS = Decimal(env.str("GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS", default="24"))
except InvalidOperation:
    GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS = None
if (
    GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS is None
    or not GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS.is_finite()
    or not 0 <= GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS <= 8760
    or GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS != GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS.quantize(Decimal("0.01"))
):
    raise ImproperlyConfigured("GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS must be a number of hours from 0 (no limit) to 8760, with at most "
                               "2 decimal places (e.g. 24).")
GSHARE_BILLING_DEFAULT_RUNTIME_WARNING_MINUTES = env.int("GSHARE_BILLING_DEFAULT_RUNTIME_WARNING_MINUTES", default=15)
if GSHARE_BILLING_DEFAULT_RUNTIME_WARNING_MINUTES < 0:
    raise ImproperlyConfigured("GSHARE_BILLING_DEFAULT_RUNTIME_WARNING_MINUTES must be a whole number of minutes, at least 0.")

# Storage (billing/storage_charges.py, docs/billing.md "Storage"): the price of a volume's quota and, when no Policy row
# applies to a user, the GiB their volumes may hold in all (0: no limit).
try:
    GSHARE_STORAGE_PRICE_PER_GB_MONTH = Decimal(env.str("GSHARE_STORAGE_PRICE_PER_GB_MONTH", default="0.05"))
except InvalidOperation:
    GSHARE_STORAGE_PRICE_PER_GB_MONTH = None
if (
    GSHARE_STORAGE_PRICE_PER_GB_MONTH is None
    or not GSHARE_STORAGE_PRICE_PER_GB_MONTH.is_finite()
    or GSHARE_STORAGE_PRICE_PER_GB_MONTH < 0
    or GSHARE_STORAGE_PRICE_PER_GB_MONTH != GSHARE_STORAGE_PRICE_PER_GB_MONTH.quantize(Decimal("0.000001"))
    or GSHARE_STORAGE_PRICE_PER_GB_MONTH >= Decimal(10) ** 9
):
    raise ImproperlyConfigured(
        "GSHARE_STORAGE_PRICE_PER_GB_MONTH must be a decimal number of credits per GiB-month (30 days), at least 0, with at "
        "most 6 decimal places (e.g. 0.05)."
    )
GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB = env.int("GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB", default=500)
if GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB < 0:
    raise ImproperlyConfigured("GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB must be a whole number of GiB, at least 0 (0: no limit).")
