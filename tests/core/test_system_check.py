"""``core.api.base`` imports cleanly whoever imports it first: DRF imports it for ``DEFAULT_PAGINATION_CLASS`` (its
pagination system check does, before any view is loaded, in ``manage.py check``, ``migrate``, ``makemigrations``,
``demo``), and that import must not need ``core.api.base`` itself. It did through ``rest_framework.views``, whose class
body reads ``DEFAULT_PARSER_CLASSES`` (``core.api.base.SafeJSONParser``): an ImportError that failed every command
whenever no app had imported DRF's views before the check ran."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "DJANGO_SETTINGS_MODULE": "gshare.settings"}


def test_drf_may_import_the_pagination_class_first():
    code = ("import django; django.setup(); from rest_framework.settings import api_settings; "
            "print(api_settings.DEFAULT_PAGINATION_CLASS.__name__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "Pagination"


def test_the_system_checks_pass_in_a_fresh_process():
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "System check identified no issues" in done.stdout


def test_a_command_prints_no_warning():
    """Python's default warning filters, as an operator's shell has them: nothing on stderr (a
    ``CryptographyDeprecationWarning`` for DSA, from the signing key module, opened every command)."""
    env = {name: value for name, value in ENV.items() if name != "PYTHONWARNINGS"}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
