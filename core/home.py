"""The folder of local state on this machine (``GSHARE_HOME``)."""

from __future__ import annotations

import os
from pathlib import Path

#: The checkout (or the installed tree): ``<here>/.gshare`` is the default home.
BASE_DIR = Path(__file__).resolve().parent.parent


def gshare_home() -> Path:
    """Return the folder that holds local state (embedded servers' data, the local encryption key).

    Returns:
        ``$GSHARE_HOME`` if set, else ``<checkout>/.gshare``; created if missing.
    """
    home = Path(os.environ.get("GSHARE_HOME") or BASE_DIR / ".gshare").resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home
