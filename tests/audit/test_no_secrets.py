"""No secret ever reaches the audit trail: an end-to-end run that handles every kind of secret gShare has (a kubeconfig
with a bearer token and CA data, operator tokens minted, pushed and exchanged, signing keys generated and imported,
API tokens), then every row it wrote, the API's answer and the log lines, searched for each secret in raw,
JSON-escaped, base64 and URL-encoded form, and for the shapes of any JWT, API token or PEM block. The same search runs
over the web server's own output (gunicorn's access and error log) after connect links went through both routing
modes' checks."""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
import urllib.parse
from io import StringIO

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.cache import cache
from django.core.management import call_command

import contract
from audit.api.serializers import AuditRecordSerializer
from audit.models import AuditRecord
from clusters.models import Cluster
from identity.keys import signing_key_ensure
from identity.models import ApiToken, SigningKey
from identity.tokens import api_token_create, api_token_revoke
from sessions import connect, services
from sessions.models import Session
from tests.e2e.gunicorn import INTERNAL_HOST, PUBLIC_HOST, run_gunicorn
from tests.e2e.test_connect_ext_authz_gunicorn import PREFIX, send
from tests.factories import ClusterFactory
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db

#: Shapes no row may hold, whatever the secret: a JWT (base64 of '{"'), an API token, a PEM block and its base64.
SHAPES = ("eyJ", "gsh_", "-----BEGIN", "-----END", "LS0tLS1CRUdJT", "BEGIN%20", "PRIVATE KEY", "certificate-authority-data")


def encodings(secret: str) -> set[str]:
    """``secret`` raw, JSON-escaped, base64 (standard and URL-safe, with and without padding) and URL-encoded."""
    raw = secret.encode()
    forms = {secret, json.dumps(secret)[1:-1], urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        forms |= {encoded.decode(), encoded.decode().rstrip("=")}
    return {form for form in forms if len(form) >= 8}


def signed(cluster: Cluster, *, iat: float, exp: float) -> str:
    key = signing_key_ensure()
    payload = {"iss": "gshare-control-plane", "sub": f"operator:{cluster.public_id}", "aud": "gshare-internal", "iat": int(iat),
               "nbf": int(iat), "exp": int(exp), "jti": "jti-of-an-old-token", "gen": cluster.credential_generation}
    return jwt.encode(payload, key.private_key_pem, algorithm="RS256", headers={"kid": key.kid})


def test_no_row_holds_a_secret_in_any_encoding(http, fleet_cluster, http_for, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gshare.audit")
    secret_values: list[str] = []

    # A cluster over TLS with a bearer token: its kubeconfig carries the token and the CA's data.
    kube_token = secrets.token_urlsafe(32)
    emulated = fleet_cluster("lab-c1", tls=True, token=kube_token)
    kubeconfig = kubeconfig_text(emulated)
    parsed = yaml.safe_load(kubeconfig)
    ca_data = parsed["clusters"][0]["cluster"]["certificate-authority-data"]
    secret_values += [kube_token, ca_data, base64.b64decode(ca_data).decode(), kubeconfig]
    response = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig, "session_domain": "lab-c1.gshare.localhost"})
    assert response.status_code == 201, response.text
    cluster_id = response.json()["id"]
    assert http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig, "session_domain": "c1.example.org"}).status_code == 200

    # Operator tokens: minted, pushed into the cluster's Secret, exchanged by the operator.
    out = StringIO()
    call_command("mint_operator_token", cluster_id, stdout=out)
    secret_values.append(out.getvalue().strip())
    call_command("rotate_operator_tokens", "--cluster", cluster_id, stdout=StringIO())
    pushed = next(s for s in emulated.objects_of("secrets") if s["metadata"]["name"] == "gshare-operator-internal-jwt")
    secret_values.append(base64.b64decode(pushed["data"]["internal-jwt"]).decode())
    cluster = Cluster.objects.get(public_id=cluster_id)
    now = time.time()
    old = signed(cluster, iat=now - 3000, exp=now + 600)
    exchanged = http_for(old).post("/internal/v1/token")
    assert exchanged.status_code == 200, exchanged.text
    secret_values += [old, exchanged.json()["token"]]
    call_command("revoke_operator_tokens", cluster_id, stdout=StringIO())

    # Signing keys: rotated, imported (the key file's PEM), then every private half on record.
    call_command("rotate_signing_key", stdout=StringIO())
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()).decode()
    (tmp_path / "key.pem").write_text(pem)
    call_command("import_signing_key", "--file", str(tmp_path / "key.pem"), stdout=StringIO())
    secret_values.append(pem)
    secret_values += [k.private_key_pem for k in SigningKey.objects.all()]

    # API tokens: created by the command and the service, one revoked.
    out = StringIO()
    call_command("create_api_token", "admin", "--name", "ci", stdout=out)
    secret_values.append(out.getvalue().strip())
    row, text = api_token_create(username="admin", name="laptop")
    secret_values.append(text)
    api_token_revoke(token=row)
    secret_values += list(ApiToken.objects.values_list("token_hash", flat=True))

    actions = set(AuditRecord.objects.values_list("action", flat=True))
    assert {"cluster_register", "cluster_update", "operator_token_mint", "operator_token_rotate", "operator_token_exchange",
            "operator_tokens_revoke", "signing_key_rotate", "signing_key_import", "api_token_create", "api_token_revoke"} <= actions

    # Every row, as the API shows it and as stored (all columns), and every log line.
    listed = http.get("/api/v1/audit?limit=1000")
    assert listed.status_code == 200 and listed.json()["count"] == AuditRecord.objects.count()
    stored = json.dumps([AuditRecordSerializer(r).data for r in AuditRecord.objects.all()], default=str)
    columns = json.dumps(list(AuditRecord.objects.values()), default=str)
    lines = "\n".join(f"{r.getMessage()} {json.dumps(getattr(r, 'audit', {}), default=str)}" for r in caplog.records
                      if r.name.startswith("gshare.audit"))
    assert "operator_token_exchange" in lines and "cluster_register" in lines
    for dump in (listed.text, stored, columns, lines):
        for shape in SHAPES:
            assert shape not in dump, shape
        for value in secret_values:
            for form in encodings(value):
                assert form not in dump, f"a secret ({len(value)} characters) is in the audit trail"


#: gunicorn's access-log format with every atom that can hold a credential: the request line, path, query, Referer,
#: user, the headers both routing modes send (ingress-nginx's auth subrequest, Envoy's check), the answer's
#: ``Location``/``Set-Cookie``, and the environ's copies. An operator may log any of them; none may show a token.
EVERY_ATOM_FORMAT = " ".join([
    '"%(r)s" %(s)s %(U)s q=%(q)s f=%(f)s u=%(u)s a=%(a)s',
    *(f"{name}=%({{{name}}}i)s" for name in ("x-original-url", "x-original-uri", "x-auth-request-redirect", "authorization",
                                               "cookie", "referer")),
    *(f"{name}=%({{{name}}}o)s" for name in ("location", "set-cookie")),
    *(f"{name}=%({{{name}}}e)s" for name in ("raw_uri", "query_string", "http_cookie", "http_authorization",
                                               "http_x_original_url")),
])


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("log_format", [None, EVERY_ATOM_FORMAT], ids=["default-format", "every-atom"])
def test_no_link_token_reaches_the_web_servers_logs_in_either_routing_mode(tmp_path, django_user_model, log_format):
    """gunicorn as the chart runs it (``--config python:gshare.gunicorn_hooks``, access log on), sent what each routing
    mode sends with real connect-link tokens: Envoy's ext_authz check (the original query in the request target) and
    ingress-nginx's ``auth-url`` subrequest (the original URL in ``X-Original-URL``/``X-Original-URI``/
    ``X-Auth-Request-Redirect``, the browser's Cookie, Authorization and Referer passed on), plus a refused request line.
    Its whole output (access and error log, debug level) holds no form of any token."""
    cache.clear()
    connect.clear_local_caches()
    domain = "gpu-a.example.com"
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain=domain)
    session = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    links = [services.session_connect(session=session, user=owner).split("token=")[1] for _ in range(3)]
    secret_values = list(links)
    sid = session.public_id.encode()
    args = ["--workers", "1", "--threads", "2", "--config", "python:gshare.gunicorn_hooks", "--access-logfile", "-",
            "--log-level", "debug"]
    if log_format:
        args += ["--access-logformat", log_format]
    with run_gunicorn(tmp_path, env={"GSHARE_INTERNAL_HOSTS": INTERNAL_HOST, "DJANGO_ALLOWED_HOSTS": f"{PUBLIC_HOST},{INTERNAL_HOST}"},
                      args=args) as (url, log):
        # gateway-api: Envoy's check carries the original path and query; the 307 sets the cookie.
        status, headers, _ = send(url, b"GET", PREFIX + b"/s/" + sid + b"/lab?x=1&token=" + links[0].encode(),
                                  headers={b"Referer": f"https://{domain}/s/{session.public_id}/?token={links[0]}".encode()})
        assert status == 307, headers
        cookie = headers["set-cookie"][0].split(";", 1)[0]
        secret_values.append(cookie.split("=", 1)[1])
        status, _, _ = send(url, b"GET", PREFIX + b"/s/" + sid + b"/lab", headers={b"Cookie": cookie.encode()})
        assert status == 200
        status, _, _ = send(url, b"GET", PREFIX + b"/s/" + sid + b"/lab", headers={b"Authorization": b"Bearer " + links[1].encode()})
        assert status == 200
        # ingress-nginx: the auth subrequest as its template writes it, with the browser's headers passed on.
        original = f"/s/{session.public_id}/lab?token={links[2]}"
        status, headers, _ = send(url, b"GET", contract.CONNECT_VERIFY_PATH.encode(), host=INTERNAL_HOST.encode(), headers={
            b"X-Original-URL": f"https://{domain}{original}".encode(), b"X-Original-URI": original.encode(),
            b"X-Auth-Request-Redirect": original.encode(), b"X-Original-Method": b"GET",
            b"X-Sent-From": b"nginx-ingress-controller", b"Referer": f"https://{domain}{original}".encode(),
            b"Cookie": cookie.encode(), b"User-Agent": links[2].encode(),
        })
        assert status == 200, headers
        status, _, _ = send(url, b"GET", contract.CONNECT_VERIFY_PATH.encode(), host=INTERNAL_HOST.encode(), headers={
            b"X-Original-URL": f"https://{domain}/s/{session.public_id}/".encode(),
            b"Authorization": b"Basic " + base64.b64encode(links[1].encode() + b":x"),
        })
        assert status == 401
        # A request line gunicorn refuses (a raw byte above ASCII) is quoted in its error log.
        status, _, _ = send(url, b"GET", PREFIX + b"/s/" + sid + b"/\xff?token=" + links[0].encode())
        assert status == 400
    output = log.read_text(errors="replace")
    assert f"/internal/connect/ext-authz/s/{session.public_id}/lab?x=[redacted]&token=[redacted]" in output
    assert output.count("/internal/connect/verify") >= 2 and "Invalid request" in output
    for shape in SHAPES:
        assert shape not in output, shape
    for value in secret_values:
        for form in encodings(value):
            assert form not in output, f"a token ({len(value)} characters) is in the web server's log"
