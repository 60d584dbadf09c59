"""``python -m demo.emulator --seed PATH --port N``: serve a seed file until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import signal
import sys
from typing import Any

from demo.emulator.cluster import serve
from demo.emulator.controllers.hami_metrics import SCHEMES
from demo.emulator.controllers.host_facts import validate_hosts
from demo.emulator.tls import generate_certificates

logger = logging.getLogger("demo.emulator")


_FROM_SEED: Any = object()  # --pod-startup-seconds not given


def _read_seed(path: pathlib.Path) -> tuple[dict[str, str] | None, list[dict], float | None, dict[str, dict], str]:
    """``(version, objects, podStartupSeconds, hosts, hamiMonitorScheme)`` of a seed file (podStartupSeconds None,
    hosts ``{}`` and the scheme ``current`` when the seed has no such key)."""
    seed = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(seed, dict) or not isinstance(seed.get("objects", []), list):
        raise ValueError(f"{path}: a seed is a JSON object {{\"version\": {{...}}, \"objects\": [...]}}")
    startup = seed.get("podStartupSeconds")
    if startup is not None and (isinstance(startup, bool) or not isinstance(startup, int | float) or startup < 0):
        raise ValueError(f"{path}: podStartupSeconds must be a number of seconds >= 0, not {startup!r}")
    try:
        hosts = validate_hosts(seed.get("hosts"))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    scheme = seed.get("hamiMonitorScheme", "current")
    if scheme not in SCHEMES:
        raise ValueError(f"{path}: hamiMonitorScheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    return seed.get("version"), seed.get("objects", []), startup, hosts, scheme


def _startup_seconds(text: str) -> float | None:
    """``--pod-startup-seconds``: seconds >= 0, or ``off`` (Pods stay ``Pending`` whatever the seed says)."""
    if text.lower() in ("off", "none"):
        return None
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 or 'off'")
    return value


async def _serve_until_signalled(args: argparse.Namespace) -> None:
    version, objects, seed_startup, hosts, seed_scheme = _read_seed(pathlib.Path(args.seed))
    startup = seed_startup if args.pod_startup_seconds is _FROM_SEED else args.pod_startup_seconds
    token = pathlib.Path(args.token_file).read_text(encoding="utf-8").strip() if args.token_file else None
    certificates = generate_certificates(args.host) if args.tls else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with serve(objects, version=version, token=token, host=args.host, port=args.port,
                     pod_startup_seconds=startup, hosts=hosts, tls=certificates or False,
                     hami_monitor_scheme=args.hami_monitor_scheme or seed_scheme) as (_, url):
        if args.ready_file:
            ready = pathlib.Path(args.ready_file)
            tmp = ready.with_name(ready.name + ".tmp")
            info: dict[str, Any] = {"url": url, "pid": os.getpid()}
            if certificates is not None:
                info["ca_data"] = certificates.ca_data
            tmp.write_text(json.dumps(info), encoding="utf-8")
            tmp.replace(ready)
        logger.info("emulated apiserver for %s listening on %s", args.seed, url)
        await stop.wait()
        logger.info("stopping %s", url)


def main(argv: list[str] | None = None) -> int:
    """Command line: serve a seed file until SIGTERM/SIGINT.

    ``python -m demo.emulator --seed PATH --port N [--host 127.0.0.1] [--ready-file PATH] [--token-file PATH]
    [--tls] [--pod-startup-seconds S|off] [--hami-monitor-scheme current|legacy] [--log-level LEVEL]``

    The seed is JSON ``{"version": {...}, "podStartupSeconds": 1.0, "hamiMonitorScheme": "current", "objects": [...],
    "hosts": {...}}``
    (``demo.fleet.write_seed`` writes one; ``podStartupSeconds`` is optional and enables the scheduler/HAMi/kubelet
    stand-in, see ``KubeApiEmulator``; ``--pod-startup-seconds`` overrides it, ``off`` disables it; ``hosts`` is
    optional: host facts per node name, see ``HOST_FACTS``, for gShare's attach check pods and HAMi's device
    plugin stand-in; ``hamiMonitorScheme`` is optional, ``current`` by default: the metric names of HAMi's vGPU monitor
    stand-in, ``--hami-monitor-scheme`` overrides it, see ``KubeApiEmulator``). Once
    listening, ``{"url": "http://127.0.0.1:N", "pid": <pid>}`` is written to the ready file (atomically); with
    ``--tls`` the server speaks HTTPS with a CA generated at start and the ready file is
    ``{"url": "https://127.0.0.1:N", "pid": <pid>, "ca_data": "<base64 of the CA's PEM>"}`` (a kubeconfig's
    ``certificate-authority-data``). The token file holds the admin's bearer token (cluster-admin; surrounding
    whitespace ignored); ServiceAccount tokens made through the API are accepted too, under RBAC.

    Returns:
        The process exit code: 0 after a signal, 2 for bad arguments or an unreadable seed.
    """
    parser = argparse.ArgumentParser(prog="python -m demo.emulator", description=main.__doc__.splitlines()[0])
    parser.add_argument("--seed", required=True,
                        help="seed JSON file: {\"version\": {...}, \"objects\": [...], \"hosts\": {...}}")
    parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free port, see --ready-file)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--ready-file", help="write {\"url\", \"pid\"} (and \"ca_data\" with --tls) here once "
                                             "listening")
    parser.add_argument("--token-file", help="file holding the admin's bearer token to require")
    parser.add_argument("--tls", action="store_true",
                        help="serve HTTPS with a CA and server certificate generated at start (the ready file then "
                             "also holds \"ca_data\", the CA for a kubeconfig's certificate-authority-data)")
    parser.add_argument("--pod-startup-seconds", type=_startup_seconds, default=_FROM_SEED, metavar="S|off",
                        help="schedule created Pods (HAMi rules) and run them S seconds after binding; 'off': they "
                             "stay Pending (default: the seed's podStartupSeconds, else off)")
    parser.add_argument("--hami-monitor-scheme", choices=SCHEMES,
                        help="metric names of HAMi's vGPU monitor stand-in: current (HAMi 2.9+) or legacy (HAMi "
                             "2.4-2.7) (default: the seed's hamiMonitorScheme, else current)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signalled(args))
    except (OSError, ValueError) as exc:
        print(f"demo.emulator: {exc}", file=sys.stderr)
        return 2
    return 0
