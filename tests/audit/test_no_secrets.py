"""No secret ever reaches the audit trail: an end-to-end run that handles every kind of secret gShare has (a kubeconfig
with a bearer token and CA data, operator tokens minted, pushed and exchanged, signing keys generated and imported,
API tokens), then every row it wrote, the API's answer and the log lines, searched for each secret in raw,
JSON-escaped, base64 and URL-encoded form, and for the shapes of any JWT, API token or PEM block."""

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
from django.core.management import call_command

from audit.api.serializers import AuditRecordSerializer
from audit.models import AuditRecord
from clusters.models import Cluster
from gshare.auth.keys import signing_key_ensure
from gshare.auth.tokens import api_token_create, api_token_revoke
from gshare.models import ApiToken, SigningKey
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
