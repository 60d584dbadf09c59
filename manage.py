#!/usr/bin/env python
"""Django's command-line utility for gShare's control plane."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gshare.settings")
    if sys.argv[1:2] == ["attach_cluster"]:
        # It runs on an operator's laptop and talks to the control plane through its API: no database, no Redis
        # (GSHARE_CLIENT_ONLY in gshare/settings/base.py), so nothing local is started.
        os.environ["GSHARE_CLIENT_ONLY"] = "1"
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
