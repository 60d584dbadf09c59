"""A session's CPU and memory: the request's ``cpu`` (cores) and ``memory_gib`` (GiB), the policy's defaults and maxima
per GPU, and the Kubernetes figures they become (docs/sessions.md, "CPU and memory").

* A request may ask ``cpu`` and ``memory_gib`` (decimal, more than 0, at most ``RESOURCE_PLACES`` decimal places); an
  omitted one is the owner's policy default per GPU × the GPUs (``default_cpu_per_gpu``, ``default_memory_gib_per_gpu``;
  a default of 0 asks nothing: the pod then has no request for it). More than the policy's maximum per GPU × the GPUs
  (``max_cpu_per_gpu``, ``max_memory_gib_per_gpu``) is refused, naming the limit.
* The pod gets ``requests`` = ``limits`` = those figures (CPU in millicores, memory in whole MiB rounded up:
  ``cpu_millicores``, ``memory_mib``), and ``/dev/shm`` is a memory-backed ``emptyDir`` of half the memory.
* Placement counts the same millicores and MiB against each node's allocatable CPU and memory
  (``sessions.placement``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError
from sessions.errors import CPU_OVER_LIMIT, MEMORY_OVER_LIMIT

#: Decimal places of ``cpu`` and ``memory_gib`` (the session's columns'): a millicore, a thousandth of a GiB.
RESOURCE_PLACES = 3
#: The most one session may ask whatever its policy says (the session columns hold 4 integer digits for cores and 6
#: for GiB; no node comes near either).
MAX_CPU = Decimal(4096)
MAX_MEMORY_GIB = Decimal(65536)

#: A decimal number as JSON or a form sends it: ASCII digits, a point, an exponent (``Decimal`` alone would also take
#: ``1_0``, other scripts' digits, ``NaN`` and ``Infinity``).
_DECIMAL = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class InvalidResources(ApplicationError):
    """400: ``cpu`` or ``memory_gib`` is not a positive decimal number in range."""

    code = INVALID_REQUEST
    status = 400


class CpuOverLimit(ApplicationError):
    """400: more CPU than the policy's ``max_cpu_per_gpu`` × the GPUs."""

    code = CPU_OVER_LIMIT
    status = 400


class MemoryOverLimit(ApplicationError):
    """400: more memory than the policy's ``max_memory_gib_per_gpu`` × the GPUs."""

    code = MEMORY_OVER_LIMIT
    status = 400


def amount_parse(value, *, field: str, most: Decimal, unit: str) -> Decimal:
    """A positive decimal from a JSON number, a ``Decimal`` or a decimal string (a float through ``str``, never its
    binary value): finite, more than 0, at most ``most`` and ``RESOURCE_PLACES`` decimal places.

    Raises:
        InvalidResources: 400 ``invalid_request`` naming ``field``.
    """
    problem = (f"{field} must be a number of {unit} more than 0 and at most {most}, with at most {RESOURCE_PLACES} decimal "
               f"places, e.g. 4 or 0.5.")
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal, str)):
        raise InvalidResources(problem)
    text = value.strip() if isinstance(value, str) else str(value)
    if len(text) > 32 or not _DECIMAL.fullmatch(text):
        raise InvalidResources(problem)
    try:
        amount = Decimal(text)
    except (InvalidOperation, ValueError):
        raise InvalidResources(problem) from None
    if not amount.is_finite() or not 0 < amount <= most or amount != amount.quantize(Decimal(1).scaleb(-RESOURCE_PLACES)):
        raise InvalidResources(problem)
    return amount.quantize(Decimal(1).scaleb(-RESOURCE_PLACES))


def cpu_parse(value) -> Decimal:
    """``cpu`` (cores) of a request, see ``amount_parse``. Raises ``InvalidResources``."""
    return amount_parse(value, field="cpu", most=MAX_CPU, unit="CPU cores")


def memory_parse(value) -> Decimal:
    """``memory_gib`` (GiB) of a request, see ``amount_parse``. Raises ``InvalidResources``."""
    return amount_parse(value, field="memory_gib", most=MAX_MEMORY_GIB, unit="GiB")


def amount_text(value) -> str:
    """A ``cpu``/``memory_gib`` value as one text for every way of writing it (``4``, ``"4.0"``, ``4.000``), for the
    idempotency fingerprint; a value the request will refuse keeps its own text."""
    try:
        return format(amount_parse(value, field="", most=max(MAX_CPU, MAX_MEMORY_GIB), unit="").normalize(), "f")
    except InvalidResources:
        return repr(value)


@dataclass(frozen=True)
class Resources:
    """The CPU and memory a session gets: ``cpu`` cores and ``memory_gib`` GiB, each None when none is asked (a policy
    default of 0)."""

    cpu: Decimal | None
    memory_gib: Decimal | None


def _or_default(asked: Decimal | None, *, default: Decimal, gpus: int) -> Decimal | None:
    """``asked``, else the default per GPU × ``gpus`` (None when that is 0: nothing asked)."""
    if asked is not None:
        return asked
    amount = Decimal(default) * gpus
    return amount.quantize(Decimal(1).scaleb(-RESOURCE_PLACES)) if amount > 0 else None


def resources_resolve(*, policy, gpus: int, cpu: Decimal | None, memory_gib: Decimal | None) -> Resources:
    """What a request of ``gpus`` GPUs gets: the parsed ``cpu``/``memory_gib`` (``cpu_parse``/``memory_parse``), or the
    policy's default per GPU × ``gpus`` for the one omitted.

    Args:
        policy: the owner's ``billing.admission.EffectivePolicy``.
        gpus: the GPUs asked (1 or more).

    Raises:
        CpuOverLimit: 400 ``cpu_over_limit``: more than ``max_cpu_per_gpu`` × ``gpus`` (the body adds ``max_cpu``).
        MemoryOverLimit: 400 ``memory_over_limit``: more than ``max_memory_gib_per_gpu`` × ``gpus`` (adds
            ``max_memory_gib``).
    """
    cpu_most = Decimal(policy.max_cpu_per_gpu) * gpus
    memory_most = Decimal(policy.max_memory_gib_per_gpu) * gpus
    if cpu is not None and cpu > cpu_most:
        raise CpuOverLimit(f"cpu {cpu} is over your policy's limit of {policy.max_cpu_per_gpu} cores per GPU (max_cpu_per_gpu), "
                           f"{cpu_most.normalize():f} for {gpus} GPU(s): ask for at most that.", extra={"max_cpu": format(cpu_most.normalize(), "f")})
    if memory_gib is not None and memory_gib > memory_most:
        raise MemoryOverLimit(
            f"memory_gib {memory_gib} is over your policy's limit of {policy.max_memory_gib_per_gpu} GiB per GPU "
            f"(max_memory_gib_per_gpu), {memory_most.normalize():f} GiB for {gpus} GPU(s): ask for at most that.",
            extra={"max_memory_gib": format(memory_most.normalize(), "f")})
    return Resources(
        cpu=_or_default(cpu, default=policy.default_cpu_per_gpu, gpus=gpus),
        memory_gib=_or_default(memory_gib, default=policy.default_memory_gib_per_gpu, gpus=gpus),
    )


def cpu_millicores(cpu: Decimal | None) -> int | None:
    """Cores as Kubernetes millicores (exact: ``cpu`` has at most 3 decimal places), or None."""
    return None if cpu is None else int(Decimal(cpu) * 1000)


def memory_mib(memory_gib: Decimal | None) -> int | None:
    """GiB as whole MiB, rounded up (0.001 GiB is 1.024 MiB: the pod never gets less than asked), or None."""
    return None if memory_gib is None else math.ceil(Decimal(memory_gib) * 1024)
