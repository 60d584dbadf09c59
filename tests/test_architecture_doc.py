"""docs/architecture.md stays true: its layer list is import-linter's, its periodic tasks are the ones the migrations
schedule, and every file or folder it names exists."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from gshare.celery import app as celery_app

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end != -1 else None]


def test_the_layer_list_is_the_layers_contract():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = [line.strip() for line in config["importlinter:contract:layers"]["layers"].strip().splitlines()]
    block = re.search(r"```\n(.*?)```", _section("Layers"), re.S).group(1)
    documented = [re.split(r"\s{2,}", line.strip())[0] for line in block.strip().splitlines()]
    assert documented == contract


def test_the_periodic_tasks_are_the_ones_the_migrations_schedule():
    celery_app.loader.import_default_modules()
    registered = {name for name in celery_app.tasks if not name.startswith("celery.")}
    migrations = "\n".join(path.read_text() for path in ROOT.glob("*/migrations/*.py"))
    scheduled = {name for name in registered if f'"{name}"' in migrations}
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", _section("Periodic work"), re.M))
    assert scheduled and documented == scheduled


def test_every_path_it_names_exists():
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_0-9.]*)`", DOC))
    named |= {line.split()[0] for line in re.search(r"```\n(manage\.py.*?)```", DOC, re.S).group(1).splitlines()
              if line and not line.startswith(" ")}
    missing = sorted(path for path in named if not _exists(path))
    assert not missing, "\n".join(missing)


def _exists(path: str) -> bool:
    """A path from the root or from docs/, a migration named by its number, or a part every app has (``api/``)."""
    return ((ROOT / path).exists() or (ROOT / "docs" / path).exists() or any(ROOT.glob(path + "_*.py"))
            or any(ROOT.glob(f"*/{path}")))
