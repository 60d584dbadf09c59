"""The operator's token handling (operator_agent.token) against the Kubernetes API emulator and a loopback control plane.

No Django here: the Secret lives in ``demo.emulator.EmulatedCluster`` (served over HTTP), the control plane is a
small ``http.server`` on 127.0.0.1 that accepts the tokens it is told to and answers ``POST /internal/v1/token``.
Tokens are unsigned-for-us JWTs (HS256 with a throwaway key): the operator only decodes their payload.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import kubernetes
import pytest

from contract import INVENTORY_PATH, TOKEN_INVALID, TOKEN_PATH, TOKEN_REVOKED
from demo import fleet
from demo.emulator import EmulatedCluster
from operator_agent.config import ConfigError, OperatorConfig
from operator_agent.control_plane_client import ControlPlaneAuthError, ControlPlaneClient
from operator_agent.token import (
    REFRESH_FRACTION,
    REFRESH_JITTER,
    Candidate,
    NoTokenError,
    SecretTokenStore,
    TokenRefresher,
    TokenSource,
    token_info,
)

CLUSTER_ID = "clu_test"
NAMESPACE = "gshare-system"
SECRET = "gshare-operator-internal-jwt"
APISERVER_TOKEN = "emulator-token"
NOW = int(time.time())


def make_token(*, exp_in: int = 3600, life: int = 3600, gen: int | None = 1, sub: str = f"operator:{CLUSTER_ID}", **extra) -> str:
    claims = {"sub": sub, "iat": NOW + exp_in - life, "exp": NOW + exp_in, "jti": f"{exp_in}-{gen}-{sub}", **extra}
    if gen is not None:
        claims["gen"] = gen
    return jwt.encode(claims, "test-key-" * 4, algorithm="HS256")


def secret_object(token: str | None) -> dict:
    data = {"internal-jwt": base64.b64encode(token.encode()).decode()} if token else {}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": SECRET, "namespace": NAMESPACE}, "data": data}


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with EmulatedCluster(fleet.cluster_objects("lab-c1"), version=fleet.cluster_version("lab-c1"), token=APISERVER_TOKEN) as running:
        yield running


@pytest.fixture
def core_v1(cluster) -> Iterator[kubernetes.client.CoreV1Api]:
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    yield kubernetes.client.CoreV1Api(api)
    api.close()


def put_secret(cluster: EmulatedCluster, token: str | None) -> None:
    cluster.add(secret_object(token))


def secret_token(cluster: EmulatedCluster) -> str | None:
    for secret in cluster.objects_of("secrets"):
        if secret["metadata"]["name"] == SECRET:
            data = secret.get("data") or {}
            return base64.b64decode(data["internal-jwt"]).decode() if "internal-jwt" in data else None
    return None


@pytest.fixture
def store(core_v1) -> SecretTokenStore:
    return SecretTokenStore(core_v1, namespace=NAMESPACE, name=SECRET, cluster_id=CLUSTER_ID, request_timeout=5.0)


@pytest.fixture
def token_file(tmp_path):
    return tmp_path / "internal-jwt"


@dataclass
class FakeControlPlane:
    """Accepts the tokens in ``valid`` (401 otherwise, with ``refusal``); ``issue`` is what ``POST /internal/v1/token`` returns."""

    url: str = ""
    valid: set = field(default_factory=set)
    refusal: str = TOKEN_INVALID
    issue: str | None = None
    requests: list = field(default_factory=list)


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    state = FakeControlPlane()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            state.requests.append((self.command, self.path, token))
            if token not in state.valid:
                status, body = 401, {"code": state.refusal, "detail": "refused by the test"}
            elif self.command == "POST" and self.path == TOKEN_PATH:
                status, body = 200, {"token": state.issue, "expires_at": "whatever", "generation": 1}
            else:
                status, body = 200, {"nodes": 0}
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_PUT = do_POST = _serve

        def log_message(self, format, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(5)


def client_for(control_plane: FakeControlPlane, tokens: TokenSource, token_file) -> ControlPlaneClient:
    config = OperatorConfig(cluster_id=CLUSTER_ID, control_plane_url=control_plane.url, token_file=str(token_file), http_timeout=5.0)
    return ControlPlaneClient(config, tokens=tokens, sleep=lambda _: None, max_attempts=2)


# --------------------------------------------------------------------------- decoding


def test_token_info_decodes_without_a_key():
    info = token_info(make_token(exp_in=100, life=400, gen=3))
    assert (info.sub, info.exp - info.iat, info.exp, info.gen) == (f"operator:{CLUSTER_ID}", 400, NOW + 100, 3)
    assert token_info(make_token(gen=None)).gen == 1  # tokens without gen are generation 1
    assert token_info(make_token(gen=True)).gen == 1
    for garbage in ("", "not-a-jwt", "a.b.c", "eyJhbGciOiJSUzI1NiJ9.TOKEN-A.c2ln", "a." + base64.urlsafe_b64encode(b"[1]").decode() + ".c"):
        assert token_info(garbage) is None


# --------------------------------------------------------------------------- choosing


@pytest.mark.parametrize("newest", ["file", "secret", "memory"])
def test_the_token_with_the_latest_exp_wins(cluster, store, token_file, newest):
    tokens = {source: make_token(exp_in=3600 + (1000 if source == newest else i * 10)) for i, source in enumerate(["file", "secret", "memory"])}
    token_file.write_text(tokens["file"] + "\n")
    put_secret(cluster, tokens["secret"])
    source = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID)
    source.remember(tokens["memory"])
    chosen = source.best()
    assert (chosen.source, chosen.token) == (newest, tokens[newest])


def test_a_newer_generation_beats_a_later_expiry_and_the_own_cluster_beats_another(cluster, store, token_file):
    token_file.write_text(make_token(exp_in=90000, gen=1))
    put_secret(cluster, make_token(exp_in=600, gen=2))
    source = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID)
    assert source.best().source == "secret"
    source.remember(make_token(exp_in=99999, gen=5, sub="operator:clu_other"))
    assert source.best().source == "secret"


def test_the_secret_read_is_cached_and_read_again_when_asked(cluster, store, token_file):
    token_file.write_text(make_token(exp_in=100))
    put_secret(cluster, make_token(exp_in=200))
    now = [0.0]
    source = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID, secret_read_interval=10, clock=lambda: now[0])
    assert token_info(source.current()).exp == NOW + 200
    pushed = make_token(exp_in=300)
    put_secret(cluster, pushed)
    now[0] = 5.0
    assert token_info(source.current()).exp == NOW + 200  # cached
    assert source.current(fresh=True) == pushed
    put_secret(cluster, make_token(exp_in=400))
    now[0] = 16.0
    assert token_info(source.current()).exp == NOW + 400


def test_without_secret_or_file_the_others_are_used(cluster, store, token_file, caplog):
    source = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID)
    with pytest.raises(NoTokenError, match="cannot read operator token file") as excinfo:
        source.current()
    assert f"Secret {NAMESPACE}/{SECRET} does not exist" in str(excinfo.value)
    put_secret(cluster, make_token())
    assert source.current(fresh=True) == secret_token(cluster)

    down = SecretTokenStore(store.core_v1, namespace="nope", name=SECRET, request_timeout=1.0)
    token_file.write_text(make_token(exp_in=50))
    only_file = TokenSource(str(token_file), secret=down)
    assert only_file.best().source == "file"
    assert only_file.best(fresh=True).source == "file"
    warnings = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage() and "nope" in r.getMessage()]
    assert len(warnings) == 1  # logged when it changes, not on every read


# --------------------------------------------------------------------------- 401 fallback


def test_a_refused_token_gives_way_to_another_at_once(cluster, store, token_file, control_plane, caplog):
    revoked = make_token(exp_in=90000, gen=1)  # newest by expiry, but revoked
    pushed = make_token(exp_in=600, gen=1, jti="pushed")
    token_file.write_text(revoked)
    put_secret(cluster, pushed)
    control_plane.valid, control_plane.refusal = {pushed}, TOKEN_REVOKED
    tokens = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID)
    client = client_for(control_plane, tokens, token_file)

    assert client.put_inventory({"nodes": []}) == {"nodes": 0}
    assert [t for _, _, t in control_plane.requests] == [revoked, pushed]
    assert "operator token expired or revoked" not in caplog.text
    assert "trying the secret token" in caplog.text
    client.put_inventory({"nodes": []})
    assert control_plane.requests[-1][2] == pushed  # the refused one stays passed over
    for token in (revoked, pushed):
        assert token not in caplog.text


def test_when_every_token_is_refused_the_rotate_line_is_logged(token_file, control_plane, caplog):
    token_file.write_text(make_token())
    client = client_for(control_plane, TokenSource(str(token_file)), token_file)
    with pytest.raises(ControlPlaneAuthError):
        client.put_inventory({"nodes": []})
    assert len(control_plane.requests) == 1
    assert "operator token expired or revoked: rotate it" in caplog.text


# --------------------------------------------------------------------------- writing the Secret


def test_write_if_newer_keeps_a_newer_pushed_token(cluster, store):
    put_secret(cluster, make_token(exp_in=100))
    refreshed = make_token(exp_in=500)
    assert store.write_if_newer(refreshed) is True
    assert secret_token(cluster) == refreshed

    pushed = make_token(exp_in=900)
    put_secret(cluster, pushed)
    assert store.write_if_newer(make_token(exp_in=700)) is False  # the push is newer: it stays
    assert secret_token(cluster) == pushed
    assert store.write_if_newer(make_token(exp_in=100, gen=2)) is True  # a newer generation always wins
    assert token_info(secret_token(cluster)).gen == 2


def test_write_never_creates_the_secret(store):
    with pytest.raises(kubernetes.client.ApiException) as excinfo:
        store.write_if_newer(make_token())
    assert excinfo.value.status == 404


# --------------------------------------------------------------------------- self-refresh


def test_refresh_is_due_between_a_fifth_and_a_quarter_of_the_life_left():
    candidate = Candidate.of(make_token(exp_in=1000, life=1000), "file")
    early = TokenRefresher(TokenSource("/nonexistent"), client=None, rng=lambda: 0.0).refresh_at(candidate)
    late = TokenRefresher(TokenSource("/nonexistent"), client=None, rng=lambda: 0.999999).refresh_at(candidate)
    assert early == pytest.approx(NOW + 1000 - 1000 * REFRESH_FRACTION)
    assert late == pytest.approx(NOW + 1000 - 1000 * REFRESH_FRACTION * (1 - REFRESH_JITTER), abs=0.01)
    assert TokenRefresher(TokenSource("/nonexistent"), client=None).refresh_at(Candidate.of("not-a-jwt", "file")) is None


def test_refresh_exchanges_remembers_and_writes_the_secret(cluster, store, token_file, control_plane, caplog):
    caplog.set_level(logging.DEBUG)
    old = make_token(exp_in=100, life=1000)  # 10% of its life left: due
    new = make_token(exp_in=3600, life=3600, jti="new")
    token_file.write_text(old)
    put_secret(cluster, old)
    control_plane.valid, control_plane.issue = {old, new}, new
    tokens = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID)
    client = client_for(control_plane, tokens, token_file)
    refresher = TokenRefresher(tokens, client)

    assert refresher.maybe_refresh() is True
    assert control_plane.requests[-1][:2] == ("POST", TOKEN_PATH)
    assert secret_token(cluster) == new
    assert tokens.current() == new
    assert refresher.maybe_refresh() is False  # the new one is not due
    client.put_inventory({"nodes": []})
    assert control_plane.requests[-1] == ("PUT", INVENTORY_PATH, new)
    assert "operator token refreshed: generation 1" in caplog.text and "written to Secret" in caplog.text
    for token in (old, new):
        assert token not in caplog.text


def test_push_and_refresh_do_not_fight(cluster, store, token_file, control_plane, caplog):
    """The operator refreshes while the control plane pushes a newer token: the pushed one stays and is used."""
    old = make_token(exp_in=100, life=1000)
    refreshed = make_token(exp_in=3000, life=3000, jti="refreshed")
    pushed = make_token(exp_in=3600, life=3600, jti="pushed")
    token_file.write_text(old)
    control_plane.valid, control_plane.issue = {old, refreshed, pushed}, refreshed
    tokens = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID, secret_read_interval=3600)
    assert tokens.best().source == "file"  # the operator's last read found no Secret (kept for an hour)
    put_secret(cluster, pushed)  # the control plane pushes meanwhile
    refresher = TokenRefresher(tokens, client_for(control_plane, tokens, token_file))

    assert refresher.maybe_refresh() is True
    assert secret_token(cluster) == pushed  # not overwritten by the older refreshed token
    assert "already holds a newer one" in caplog.text
    assert tokens.current(fresh=True) == pushed

    # And the other way round: a refreshed token newer than the Secret's replaces it.
    newer = make_token(exp_in=7200, life=7200, jti="newer")
    control_plane.valid.add(newer)
    control_plane.issue = newer
    put_secret(cluster, make_token(exp_in=150, life=1000, jti="due"))
    tokens = TokenSource(str(token_file), secret=store, cluster_id=CLUSTER_ID)
    assert TokenRefresher(tokens, client_for(control_plane, tokens, token_file)).maybe_refresh() is True
    assert secret_token(cluster) == newer


def test_a_failed_refresh_is_logged_and_the_old_token_kept(token_file, control_plane, caplog):
    old = make_token(exp_in=100, life=1000)
    token_file.write_text(old)
    control_plane.valid = set()  # revoked
    tokens = TokenSource(str(token_file))
    assert TokenRefresher(tokens, client_for(control_plane, tokens, token_file)).maybe_refresh() is False
    assert tokens.current() == old
    assert "operator token not refreshed" in caplog.text


# --------------------------------------------------------------------------- configuration


def test_secret_settings_are_read_and_checked():
    required = {"GSHARE_CLUSTER_ID": CLUSTER_ID, "GSHARE_CONTROL_PLANE_URL": "https://gshare.example.com"}
    assert not OperatorConfig.from_environ(required).token_secret_configured
    assert not OperatorConfig.from_environ({**required, "GSHARE_OPERATOR_NAMESPACE": NAMESPACE}).token_secret_configured
    config = OperatorConfig.from_environ({**required, "GSHARE_OPERATOR_NAMESPACE": NAMESPACE, "GSHARE_TOKEN_SECRET_NAME": SECRET})
    assert (config.operator_namespace, config.token_secret_name, config.token_secret_configured) == (NAMESPACE, SECRET, True)
    with pytest.raises(ConfigError, match="GSHARE_OPERATOR_NAMESPACE"):
        OperatorConfig.from_environ({**required, "GSHARE_OPERATOR_NAMESPACE": "Bad_NS"})
    with pytest.raises(ConfigError, match="GSHARE_TOKEN_SECRET_NAME"):
        OperatorConfig.from_environ({**required, "GSHARE_TOKEN_SECRET_NAME": "not/a/name"})
