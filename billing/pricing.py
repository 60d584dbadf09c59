"""Prices and shares: what a GPU-second costs, in exact ``Decimal`` arithmetic (never float).

Units:
    price: credits per GPU-hour (``Price.credits_per_gpu_hour``).
    share: the fraction of one GPU a session holds, 0 < share <= 1, 6 decimal places (``SHARE``).
    seconds: wall-clock seconds of a usage window.
    cost: credits, 6 decimal places (``billing.models.CREDITS``).

Rounding: a share is rounded to 6 places with ``ROUND_HALF_EVEN``; a window's cost is rounded UP to the credit
quantum (0.000001 credits, ``ROUND_CEILING``): each sample is rounded on its own, so rounding to nearest would let an
operator that cuts held time into windows too short to cost half a quantum (a few milliseconds of a share) report
every second as used and be charged nothing for them. Up costs at most 0.000001 credits per sample. A charge is the
exact sum of its samples' rounded costs, so the ledger, the samples and the balance always agree to the last digit.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Context, Decimal

from django.conf import settings

from billing.models import CREDITS, Price

#: Shares are kept with 6 decimal places (``UsageSample.share`` is ``numeric(9, 6)``).
SHARE = Decimal("0.000001")
ONE = Decimal(1)
_HUNDRED = Decimal(100)
_SECONDS_PER_HOUR = Decimal(3600)
#: Enough digits that every intermediate product is exact before the final rounding (prices have at most 18
#: digits, shares 7, seconds 12).
_EXACT = Context(prec=60, rounding=ROUND_HALF_EVEN)


def default_price() -> Decimal:
    """The fallback price, credits per GPU-hour: setting ``GSHARE_BILLING_DEFAULT_PRICE`` (default 1.0)."""
    return Decimal(settings.GSHARE_BILLING_DEFAULT_PRICE)


def prices_by_model() -> dict[str, Decimal]:
    """Every ``Price`` row as ``{gpu_model: credits per GPU-hour}`` (the default row under ``""``), in one query."""
    return dict(Price.objects.values_list("gpu_model", "credits_per_gpu_hour"))


def price_for_model(model: str, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Credits per GPU-hour for the GPU model ``model`` (``clusters.GpuDevice.model``, e.g. ``NVIDIA H100 80GB HBM3``).

    The model's own ``Price`` row, else the default row (``gpu_model`` ""), else ``GSHARE_BILLING_DEFAULT_PRICE``.

    Args:
        model: the device model as inventory reports it (exact match); "" or None asks for the default.
        prices: a ``prices_by_model()`` result to reuse (no query); None reads the table (one query).
    """
    if prices is None:
        prices = prices_by_model()
    price = prices.get(model or "")
    if price is None:
        price = prices.get("")
    return default_price() if price is None else price


#: HAMi's ``nvidia.com/gpucores`` is a percent of one GPU's SMs; 100 is the whole GPU (HAMi-core applies no SM limit
#: to a container without ``gpucores``, so a share that leaves cores out runs with all of them).
FULL_CORES = 100


def share_cores(*, gpu_cores: int | None, split_count: int) -> int:
    """The cores (percent of one GPU) a share reserves on a device, what HAMi is asked to enforce and what it is priced at.

    A share that leaves cores out gets what HAMi gives it, every SM (``FULL_CORES``). A share never takes less than
    one of the device's HAMi split slots, ``ceil(100 / split_count)`` percent: a share holds one of ``split_count``
    slots whatever it asks, so ten 1 % shares on a GPU split 10 would otherwise fill it for a tenth of its price.

    Args:
        gpu_cores: percent of one GPU asked (1-100), or None.
        split_count: the device's HAMi split count (``GpuDevice.split_count``, >= 1).

    Returns:
        Percent of one GPU, from ``ceil(100 / split_count)`` to 100.
    """
    asked = FULL_CORES if gpu_cores is None else gpu_cores
    return max(asked, -(-FULL_CORES // max(split_count, 1)))


def gpu_share(*, device_memory_mib: int | None, gpu_memory_mib: int | None, gpu_cores: int | None) -> Decimal:
    """The fraction of one GPU a session is priced at on a device, rounded to 6 places (``ROUND_HALF_EVEN``).

    One definition with placement's reservation (``sessions.placement``) and the manifest HAMi enforces: a missing
    value means what HAMi gives, all of that dimension of the GPU. So a whole GPU (both null) is 1, a share that
    leaves memory or cores out is 1 (it reserves the device's whole memory, or runs without an SM limit), and a share
    that names both is ``max(gpu_memory_mib / device_memory_mib, gpu_cores / 100)``, capped at 1. Placement
    stores the cores it reserved on the session (``share_cores``: at least one split slot), so a placed share's
    ``gpu_cores`` already covers its slot.

    Args:
        device_memory_mib: the device's memory, MiB (HAMi's registered ``memory_mib``). None or 0 for a device
            that is not known: a share asking for memory then counts 1 (the most it can be).
        gpu_memory_mib: MiB per GPU the session asked for (HAMi ``nvidia.com/gpumem``), or None.
        gpu_cores: percent of one GPU (HAMi ``nvidia.com/gpucores``), or None.
    """
    if gpu_memory_mib is None or gpu_cores is None or not device_memory_mib:
        return ONE
    share = max(_EXACT.divide(Decimal(gpu_memory_mib), Decimal(device_memory_mib)),
                _EXACT.divide(Decimal(gpu_cores), Decimal(FULL_CORES)))
    return min(share, ONE).quantize(SHARE, rounding=ROUND_HALF_EVEN)


def window_cost(*, price: Decimal, share: Decimal, seconds: Decimal | int) -> Decimal:
    """Credits a window costs: ``price × share × seconds / 3600``, rounded up to 0.000001 credits (``ROUND_CEILING``:
    a window is never charged less than it used, however short).

    Args:
        price: credits per GPU-hour.
        share: fraction of the GPU (``gpu_share``).
        seconds: length of the window, seconds (a ``Decimal`` keeps microseconds exact).
    """
    exact = _EXACT.divide(_EXACT.multiply(_EXACT.multiply(price, share), Decimal(seconds)), _SECONDS_PER_HOUR)
    return exact.quantize(CREDITS, rounding=ROUND_CEILING)


def hourly_cost(*, price: Decimal, share: Decimal) -> Decimal:
    """Credits one GPU share costs per hour (``price × share``), rounded to 0.000001 credits (``ROUND_HALF_EVEN``)."""
    return _EXACT.multiply(price, share).quantize(CREDITS, rounding=ROUND_HALF_EVEN)
