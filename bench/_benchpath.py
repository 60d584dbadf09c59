"""Imported first by every benchmark script: moves this folder after the standard library on ``sys.path``.

Python puts a script's folder first on the path, and ``bench/queue.py`` has the standard library's name ``queue``,
which ``concurrent.futures``, urllib3 and Celery import: with this folder first they would get the benchmark instead.
This folder stays on the path (last), so the scripts still find ``_benchenv`` and the other helpers.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE] + [_HERE]
if "queue" in sys.modules and os.path.dirname(os.path.abspath(getattr(sys.modules["queue"], "__file__", "") or "")) == _HERE:
    del sys.modules["queue"]  # imported from here before this ran: let the next import find the standard module
