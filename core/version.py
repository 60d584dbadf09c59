"""The gShare release this checkout is: one number for the control plane, the operator and both charts.

``GSHARE_VERSION`` equals ``appVersion`` of ``charts/gshare`` and ``charts/gshare-operator`` and
``operator_agent.__version__`` (tests/core/test_version.py holds them together). Two gShare installations
can work together when their major and minor numbers agree and they speak the same operator contract
(``contract.GSHARE_API_VERSION``): see :func:`compatible`.
"""

from __future__ import annotations

GSHARE_VERSION = "0.2.0"


def _major_minor(version: str) -> tuple[str, str]:
    parts = version.strip().lstrip("v").split(".")
    return (parts[0], parts[1] if len(parts) > 1 else "0")


def compatible(ours: str, theirs: str) -> bool:
    """True when release ``theirs`` works with release ``ours`` (same major and minor, e.g. ``0.2.0`` and ``0.2.3``).

    Args:
        ours, theirs: release numbers such as ``0.2.0`` (a leading ``v`` is ignored).
    """
    return _major_minor(ours) == _major_minor(theirs)
