"""``python -m demo.emulator --seed PATH --port N [--tls] ...``: see ``demo.emulator.cli.main``."""

import sys

from demo.emulator.cli import main

sys.exit(main())
