"""The control plane's ServiceAccount token, made by the attach (step 6), is a secret: after a fresh attach and a
connection test it is in no line the command printed, no log record (DEBUG included) or captured process output, no
audit row, no API answer and no console page; a refusal quoting it back is cleaned."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from audit.models import AuditRecord
from clusters import services
from clusters.models import Cluster
from kube.errors import clean_text
from tests.attach.test_attach_cluster import attach

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_the_service_account_token_is_never_shown(attach_settings, bare_cluster, operator_kubelet, live_server, caplog, capfd,
                                                  http, client, staff_user):
    caplog.set_level(logging.DEBUG)
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    operator_kubelet(emulated, kubeconfig_path)
    out, err, error, _ = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert error is None, out + err
    cluster = Cluster.objects.get(name="lab-c1")
    token = yaml.safe_load(cluster.kubeconfig)["users"][0]["user"]["token"]
    assert len(token) >= 20 and token != emulated.token
    services.cluster_connection_test(cluster=cluster)

    where = {"stdout": out, "stderr": err, "log records": "\n".join(r.getMessage() + str(r.args) + str(r.exc_text or "")
                                                                    for r in caplog.records)}
    captured = capfd.readouterr()
    where["process output"] = captured.out + captured.err
    where["audit rows"] = json.dumps([{k: str(v) for k, v in row.items()} for row in AuditRecord.objects.values()])
    answer = http.get(f"/api/v1/clusters/{cluster.public_id}")
    assert answer.status_code == 200
    where["GET /api/v1/clusters/{id}"] = answer.text
    where["GET /api/v1/clusters"] = http.get("/api/v1/clusters").text
    client.force_login(staff_user)
    for path in (f"/clusters/cluster/{cluster.pk}/change/", "/clusters/cluster/", "/"):
        page = client.get(path)
        assert page.status_code == 200, path
        where[path] = page.content.decode()
    assert where["log records"] and where["audit rows"] != "[]"
    for name, text in where.items():
        assert token not in text, name
    # The Secret's base64 form neither.
    import base64

    encoded = base64.b64encode(token.encode()).decode()
    for name, text in where.items():
        assert encoded not in text, name


def test_a_refusal_quoting_the_token_back_is_cleaned():
    token = "sa-token-0123456789abcdefghij"
    for message in (f"invalid bearer token {token}", f"Unauthorized: token={token}", f'{{"token": "{token}"}}',
                    "\x1b" * 2395 + token, " " * 2390 + token + " and more", "\x00" * 2390 + token, "x" * 290 + token, f"{token[:10]}\x1b[0m{token[10:]}"):
        cleaned = clean_text(message, secrets=(token,))
        assert token not in cleaned, message
        assert token[:4] not in cleaned, (message[:40], cleaned)  # not even the start of it
