"""``python -m demo.emulator.activity``: set or show what an emulated cluster's GPUs do, through its control API.

::

    python -m demo.emulator.activity --url http://127.0.0.1:41234 --token-file admin.token pod gshare-sessions/ses-ab12 busy
    python -m demo.emulator.activity --url ... --token-file ... pod gshare-sessions/ses-ab12          # show
    python -m demo.emulator.activity --url ... --token-file ... node gpu-h100-01 down                 # ok|down|hang

It calls ``PUT`` (with a state) or ``GET`` (without) on ``/emulator/v1/gpu-activity/...`` (``demo.emulator.control``)
with the emulator's admin token and prints the JSON answer. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def control_request(url: str, path: str, body: dict[str, Any] | None, *, token: str | None = None,
                    ca_file: str | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """One call of the emulator's control API.

    Args:
        url: the emulator's base URL (``http://127.0.0.1:41234``; ``https://`` with ``--tls``).
        path: the path below the base URL (``/emulator/v1/...``).
        body: JSON to ``PUT``, or None for a ``GET``.
        token: the admin's bearer token (None: none sent).
        ca_file: PEM of the CA to verify an HTTPS emulator with.
        timeout: seconds.

    Returns:
        ``(HTTP status, decoded JSON body)``.

    Raises:
        OSError: the emulator could not be reached (``urllib.error.URLError`` and time-outs included).
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method="GET" if body is None else "PUT")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode("utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring).

    Returns:
        0 when the emulator answered 200, 1 for another answer (printed), 2 for bad arguments or no answer.
    """
    parser = argparse.ArgumentParser(prog="python -m demo.emulator.activity",
                                     description="set or show GPU activity and vGPU monitors of an emulated cluster")
    parser.add_argument("--url", required=True, help="the emulator's base URL")
    parser.add_argument("--token-file", help="file holding the emulator's admin token (whitespace around it ignored)")
    parser.add_argument("--ca-file", help="CA (PEM) of an HTTPS emulator")
    what = parser.add_subparsers(dest="what", required=True)
    pod = what.add_parser("pod", help="a pod's containers: busy or idle on their HAMi GPUs")
    pod.add_argument("pod", metavar="NAMESPACE/NAME")
    pod.add_argument("state", nargs="?", choices=("busy", "idle"))
    node = what.add_parser("node", help="a node's vGPU monitor: ok, down (refuses) or hang")
    node.add_argument("node", metavar="NODE")
    node.add_argument("monitor", nargs="?", choices=("ok", "down", "hang"))
    args = parser.parse_args(argv)
    token = pathlib.Path(args.token_file).read_text(encoding="utf-8").strip() if args.token_file else None
    if args.what == "pod":
        namespace, slash, name = args.pod.partition("/")
        if not slash or not namespace or not name:
            parser.error("the pod is NAMESPACE/NAME")
        path = f"/emulator/v1/gpu-activity/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}"
        body = None if args.state is None else {"state": args.state}
    else:
        path = f"/emulator/v1/gpu-activity/nodes/{urllib.parse.quote(args.node)}"
        body = None if args.monitor is None else {"monitor": args.monitor}
    try:
        status, answer = control_request(args.url, path, body, token=token, ca_file=args.ca_file)
    except OSError as exc:
        print(f"demo.emulator.activity: {args.url}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(answer, indent=1))
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
