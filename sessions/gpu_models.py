"""GPU models a session request accepts: checking the names asked for and resolving them to the fleet's models.

A request names models the way people say them (``H100``, ``a100 80gb``) or as the fleet reports them
(``NVIDIA H100 80GB HBM3``: ``GpuDevice.model``, HAMi's device type without its ``NVIDIA-`` prefix). A name matches
a fleet model when it equals it ignoring case, or when its words are consecutive whole words of the model's name,
ignoring case (words: runs of letters and digits; ``-``, ``_``, spaces and other punctuation separate them). So
``H100`` matches ``NVIDIA H100 80GB HBM3`` and ``NVIDIA H100-SXM5-80GB``, ``A100`` matches ``NVIDIA A100-SXM4-40GB``,
and ``A10`` does not match ``NVIDIA A100-PCIE-40GB`` (a word is never cut). A name matching several models accepts
each of them; the session stores the resolved set (``Session.gpu_models``), which placement and the cluster's HAMi
(``nvidia.com/use-gputype``, docs/sessions.md) then enforce.
"""

from __future__ import annotations

import re

from clusters.models import ClusterGpuModel, GpuDevice
from clusters.selectors import fleet_gpu_models
from core.exceptions import ApplicationError
from sessions.errors import GPU_MODEL_UNKNOWN

#: What HAMi puts before a GPU's model in its device type (``NVIDIA-NVIDIA A10``): ``nvidia.com/use-gputype`` is matched
#: against the whole type.
HAMI_TYPE_PREFIX = "NVIDIA-"

#: Most names one request may list.
MAX_GPU_MODELS = 16
#: Longest name (``GpuDevice.model`` holds 128 characters).
MAX_GPU_MODEL_LENGTH = 128

_WORD = re.compile(r"[a-z0-9]+")


class GpuModelUnknown(ApplicationError):
    """400: a GPU model name that matches none of the fleet's models."""

    code = GPU_MODEL_UNKNOWN
    status = 400


def gpu_models_problem(names) -> str | None:
    """Why ``names`` (the request's ``gpu_models``) is malformed, or None when it is well formed.

    Well formed: a list of at most ``MAX_GPU_MODELS`` strings, each 1 to ``MAX_GPU_MODEL_LENGTH`` printable
    characters once stripped, with a letter or digit (an empty list is fine: any model).
    """
    if not isinstance(names, list | tuple):
        return "gpu_models must be a list of GPU model names, e.g. [\"H100\"] (GET /api/v1/gpus lists the fleet's models)"
    if len(names) > MAX_GPU_MODELS:
        return f"gpu_models may list at most {MAX_GPU_MODELS} models"
    for name in names:
        if (not isinstance(name, str) or not name.strip() or len(name.strip()) > MAX_GPU_MODEL_LENGTH
                or not name.isprintable() or not _WORD.search(name.lower())):
            return (f"gpu_models must list GPU model names of 1 to {MAX_GPU_MODEL_LENGTH} printable characters with a "
                    "letter or digit, e.g. \"H100\" or \"NVIDIA A100-SXM4-80GB\"")
    return None


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def name_matches(name: str, model: str) -> bool:
    """Whether the asked ``name`` designates the fleet ``model`` (equal ignoring case, or consecutive whole words of it)."""
    if name.strip().casefold() == model.casefold():
        return True
    asked, words = _words(name), _words(model)
    if not asked:
        return False
    return any(words[i:i + len(asked)] == asked for i in range(len(words) - len(asked) + 1))


def gpu_models_resolve(names: list[str] | tuple[str, ...], *, fleet: list[str] | None = None) -> list[str]:
    """The fleet's models that ``names`` accept, sorted and distinct; ``[]`` for no names (any model).

    Args:
        names: a well-formed ``gpu_models`` (``gpu_models_problem`` returned None).
        fleet: the fleet's models; None reads them (``clusters.selectors.fleet_gpu_models``, one query, only when
            ``names`` is not empty).

    Raises:
        GpuModelUnknown: 400 ``gpu_model_unknown`` when a name matches no model; the detail lists the fleet's models
            (``extra``: ``unknown``, the names, and ``available``, the models).
    """
    if not names:
        return []
    if fleet is None:
        fleet = fleet_gpu_models()
    resolved: set[str] = set()
    unknown: list[str] = []
    for name in names:
        matched = [model for model in fleet if name_matches(name, model)]
        if not matched:
            unknown.append(name.strip())
        resolved.update(matched)
    if unknown:
        has = ", ".join(fleet) if fleet else "no GPUs yet"
        raise GpuModelUnknown(
            f"No GPU in the fleet matches {', '.join(repr(n) for n in unknown)}: the fleet has {has}. Ask for one of "
            "those, by its full name or a word of it such as \"H100\" (GET /api/v1/gpus), or leave gpu_models out for any model.",
            extra={"unknown": unknown, "available": list(fleet)},
        )
    return sorted(resolved)


def gpu_models_overmatched(accepted: list[str], models: list[str]) -> list[str]:
    """The models among ``models`` that are not ``accepted`` but that HAMi's ``nvidia.com/use-gputype`` listing the
    ``accepted`` ones would still give: HAMi takes a GPU whose type contains an entry, ignoring case, so ``NVIDIA A10``
    also admits ``NVIDIA A100-PCIE-40GB`` (``operator_agent.manifests.session.HAMI_USE_GPUTYPE``). Sorted."""
    wanted = set(accepted)
    return sorted(
        model for model in set(models) - wanted
        if any(name.upper() in (HAMI_TYPE_PREFIX + model).upper() for name in wanted)
    )


def hami_gpu_uuids(*, cluster_id: int, models: list[str]) -> list[str]:
    """The GPUs (UUIDs, sorted) of ``cluster_id`` that HAMi must be limited to for a session accepting ``models``, or
    ``[]`` when its type annotation alone is exact there: when another model of the cluster contains an accepted name
    (``gpu_models_overmatched``), every GPU of the accepted models on the cluster, for HAMi's ``nvidia.com/use-gpuuuid``
    (an exact match). One query, two when the GPUs are needed; none for ``models`` empty."""
    if not models:
        return []
    present = list(ClusterGpuModel.objects.filter(cluster_id=cluster_id).values_list("model", flat=True))
    if not gpu_models_overmatched(models, present):
        return []
    return list(GpuDevice.objects.filter(cluster_id=cluster_id, model__in=models).order_by("uuid").values_list("uuid", flat=True))
