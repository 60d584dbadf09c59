"""The nginx in front of gunicorn (``gshare.front_proxy``), as the chart and the demo run it, for end-to-end tests.

:func:`run_front_proxy` renders :func:`gshare.front_proxy.render_nginx_conf` for a loopback port in front of a
gunicorn started by ``tests.e2e.gunicorn.run_gunicorn``, starts ``nginx -e stderr -p <tmp> -c <tmp>/nginx.conf``,
waits until it accepts connections, and stops it on exit.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from gshare.front_proxy import ProxySettings, render_nginx_conf
from tests.e2e.gunicorn import free_port
from tests.e2e.nginx import nginx_binary


@contextmanager
def run_front_proxy(tmp_path: Path, upstream_url: str, **settings) -> Iterator[str]:
    """nginx on ``127.0.0.1:<free port>`` in front of ``upstream_url``.

    Args:
        tmp_path: where its prefix (pid, buffers) and log go.
        upstream_url: gunicorn's ``http://127.0.0.1:<port>``.
        settings: :class:`ProxySettings` fields to change from the defaults the chart ships.

    Yields:
        nginx's base URL once it accepts connections; nginx is stopped on exit.
    """
    prefix = tmp_path / "front-proxy"
    prefix.mkdir()
    port = free_port()
    proxy = ProxySettings(listen=f"127.0.0.1:{port}", upstream=urlsplit(upstream_url).netloc, prefix=str(prefix))
    if os.geteuid() == 0:
        proxy = replace(proxy, user=f"{pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name}")
    conf = prefix / "nginx.conf"
    conf.write_text(render_nginx_conf(replace(proxy, **settings)))
    log = tmp_path / "front-proxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([nginx_binary(), "-e", "stderr", "-p", f"{prefix}/", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not listen in 30 s:\n" + log.read_text()
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
