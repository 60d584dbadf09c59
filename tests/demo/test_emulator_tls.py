"""The emulator's opt-in TLS mode (``EmulatedCluster(tls=True)``, ``serve(tls=...)``, ``--tls``).

client-go -- and so Helm, run in-process through ``helm_python`` -- sends a kubeconfig user's bearer token only over
TLS, so with a token required only an HTTPS emulator lets the real Helm engine in. These tests check that the server
certificate verifies against the CA in ``kubeconfig()`` (and only against it), that the token is still enforced,
that Helm lists and installs ``charts/gshare-operator``, and the command line's ``--tls`` ready file.

No database: run with ``pytest -p no:django tests/demo`` or with the project's settings.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import helm_python as helm
import kubernetes
import pytest
import urllib3
import yaml
from cryptography import x509

from demo.emulator import EmulatedCluster, ServerCertificates, generate_certificates
from tests.helpers import serve_seed

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "emulator-tls-token"
VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.3", "gitCommit": "0" * 40, "gitTreeState": "clean",
           "buildDate": "2025-03-11T19:52:21Z", "goVersion": "go1.23.6", "compiler": "gc", "platform": "linux/amd64"}


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}


SEED = [_namespace("default"), _namespace("kube-system")]


@pytest.fixture
def cluster():
    with EmulatedCluster(SEED, version=VERSION, token=TOKEN, tls=True) as running:
        yield running


@pytest.fixture
def helm_home(tmp_path, monkeypatch):
    """Keep Helm's cache, config and data directories in tmp_path."""
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "helm" / var.lower()))


def _core(config: dict) -> tuple[kubernetes.client.ApiClient, kubernetes.client.CoreV1Api]:
    api = kubernetes.config.new_client_from_config_dict(config)
    api.configuration.retries = 0  # fail fast on a TLS error instead of retrying it
    return api, kubernetes.client.CoreV1Api(api)


def _without_ca(config: dict) -> dict:
    config = json.loads(json.dumps(config))
    del config["clusters"][0]["cluster"]["certificate-authority-data"]
    return config


def _get(url: str, ca_pem: bytes, token: str | None) -> tuple[int, dict]:
    """A curl-style request verifying the server against ``ca_pem``; returns ``(status, JSON body)``."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _assert_tls_refused(config: dict) -> None:
    api, core = _core(config)
    try:
        with pytest.raises(urllib3.exceptions.MaxRetryError) as info:
            core.list_namespace()
        assert isinstance(info.value.reason, urllib3.exceptions.SSLError), info.value.reason
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value.reason)
    finally:
        api.close()


# --------------------------------------------------------------------------- certificates and the official client


def test_url_kubeconfig_and_certificate(cluster):
    assert cluster.tls is True
    assert cluster.url.startswith("https://127.0.0.1:")
    config = cluster.kubeconfig("t")
    entry = config["clusters"][0]["cluster"]
    assert entry == {"server": cluster.url, "certificate-authority-data": cluster.ca_data}
    assert base64.b64decode(entry["certificate-authority-data"]) == cluster.ca_pem
    assert config["users"] == [{"name": "t", "user": {"token": TOKEN}}]

    ca = x509.load_pem_x509_certificate(cluster.ca_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    host, port = cluster.url.removeprefix("https://").split(":")
    served = x509.load_pem_x509_certificate(ssl.get_server_certificate((host, int(port))).encode())
    assert served.issuer == ca.subject
    served.verify_directly_issued_by(ca)
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert served.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_official_client_lists_namespaces_over_verified_https(cluster):
    api, core = _core(cluster.kubeconfig("t"))
    try:
        assert [ns.metadata.name for ns in core.list_namespace().items] == ["default", "kube-system"]
        assert kubernetes.client.VersionApi(api).get_code().git_version == "v1.32.3"
    finally:
        api.close()


def test_official_client_without_the_ca_fails(cluster):
    _assert_tls_refused(_without_ca(cluster.kubeconfig("t")))  # the system trust store does not know the CA


def test_official_client_with_another_clusters_ca_fails(cluster):
    with EmulatedCluster(SEED, token=TOKEN, tls=True) as other:
        assert other.ca_pem != cluster.ca_pem
        config = cluster.kubeconfig("t")
        config["clusters"][0]["cluster"]["certificate-authority-data"] = other.ca_data
        _assert_tls_refused(config)


def test_bearer_token_still_required(cluster):
    assert _get(cluster.url + "/api/v1/namespaces", cluster.ca_pem, None)[0] == 401
    status, body = _get(cluster.url + "/api/v1/namespaces", cluster.ca_pem, "wrong")
    assert (status, body["kind"], body["reason"]) == (401, "Status", "Unauthorized")
    assert _get(cluster.url + "/healthz", cluster.ca_pem, None)[0] == 401
    status, body = _get(cluster.url + "/api/v1/namespaces", cluster.ca_pem, TOKEN)
    assert (status, body["kind"]) == (200, "NamespaceList")


def test_plain_http_client_is_not_served(cluster):
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(cluster.url.replace("https://", "http://") + "/version", timeout=5)


def test_kubeconfig_passes_the_project_validator(cluster):
    from kube.kubeconfig import validate_kubeconfig  # no settings or database needed by the validator

    text = yaml.safe_dump(cluster.kubeconfig("t"))
    host_port = cluster.url.removeprefix("https://")
    valid = validate_kubeconfig(text, loopback_allowlist=[host_port])
    assert valid.server == cluster.url
    assert valid.config["clusters"][0]["cluster"]["certificate-authority-data"] == cluster.ca_data
    assert valid.config["users"][0]["user"] == {"token": TOKEN}


def test_ca_only_while_running_and_none_without_tls():
    emulated = EmulatedCluster(SEED, tls=True)
    with pytest.raises(RuntimeError):
        _ = emulated.ca_pem  # generated at start
    with emulated:
        assert emulated.ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(RuntimeError):
        _ = emulated.ca_pem

    with EmulatedCluster(SEED, token=TOKEN) as plain:  # the default is unchanged: plain http, no CA
        assert plain.tls is False and plain.ca_pem is None and plain.ca_data is None
        assert plain.url.startswith("http://127.0.0.1:")
        assert plain.kubeconfig("p")["clusters"] == [{"name": "p", "cluster": {"server": plain.url}}]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_loopback_host_is_in_the_certificate():
    with EmulatedCluster(SEED, token=TOKEN, host="::1", tls=True) as emulated:
        assert emulated.url.startswith("https://[::1]:")
        api, core = _core(emulated.kubeconfig("v6"))
        try:
            assert [ns.metadata.name for ns in core.list_namespace().items] == ["default", "kube-system"]
        finally:
            api.close()


def test_generate_certificates():
    certificates = generate_certificates("127.0.0.2")
    assert isinstance(certificates, ServerCertificates)
    assert certificates.hosts == ("localhost", "127.0.0.1", "127.0.0.2")
    assert "key_pem" not in repr(certificates)
    assert base64.b64decode(certificates.ca_data) == certificates.ca_pem
    assert certificates.ssl_context().protocol == ssl.PROTOCOL_TLS_SERVER
    with pytest.raises(ValueError, match="loopback only"):
        generate_certificates("192.0.2.10")


# --------------------------------------------------------------------------- the real Helm engine (client-go)


def test_helm_lists_releases_over_https(cluster, helm_home):
    with helm.Config(kubeconfig_content=yaml.safe_dump(cluster.kubeconfig("t")), namespace="x") as cfg:
        assert cfg.list() == []
    assert any(r["path"] == "/api/v1/namespaces/x/secrets" for r in cluster.requests_seen())


def test_helm_refuses_a_server_it_cannot_verify(cluster, helm_home):
    with helm.Config(kubeconfig_content=yaml.safe_dump(_without_ca(cluster.kubeconfig("t"))), namespace="x") as cfg:
        with pytest.raises(helm.HelmError, match="certificate"):
            cfg.list()


def test_helm_installs_the_operator_chart(cluster, helm_home):
    values = {"clusterId": "clu_x", "controlPlaneUrl": "https://cp.example.org"}
    with helm.Config(kubeconfig_content=yaml.safe_dump(cluster.kubeconfig("t")), namespace="x") as cfg:
        release = cfg.install(str(ROOT / "charts" / "gshare-operator"), "gshare-operator", values,
                              namespace="gshare-system", create_namespace=True, timeout=60)
    assert (release["name"], release["namespace"], release["status"]) == ("gshare-operator", "gshare-system", "deployed")
    assert [d["metadata"]["name"] for d in cluster.objects_of("deployments", "apps")] == ["gshare-operator"]
    [deployment] = cluster.objects_of("deployments", "apps")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GSHARE_CLUSTER_ID"] == "clu_x" and env["GSHARE_CONTROL_PLANE_URL"] == "https://cp.example.org"
    assert "gshare-system" in [ns["metadata"]["name"] for ns in cluster.objects_of("namespaces")]
    secrets = [(s["metadata"]["namespace"], s["metadata"]["name"]) for s in cluster.objects_of("secrets")]
    assert ("gshare-system", "sh.helm.release.v1.gshare-operator.v1") in secrets  # Helm's release record


# --------------------------------------------------------------------------- command line


def test_cli_tls_ready_file_has_https_url_and_ca(tmp_path):
    seed_path = tmp_path / "seed.json"
    seed_path.write_text(json.dumps({"version": VERSION, "objects": SEED}))
    token_path = tmp_path / "token"
    token_path.write_text(TOKEN + "\n")
    process, info = serve_seed(tmp_path, seed_path, "--token-file", str(token_path), "--tls")
    try:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        assert info["pid"] == process.pid and info["url"].startswith("https://127.0.0.1:")
        ca_pem = base64.b64decode(info["ca_data"])
        assert ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "cli",
                  "clusters": [{"name": "cli", "cluster": {"server": info["url"],
                                                          "certificate-authority-data": info["ca_data"]}}],
                  "users": [{"name": "cli", "user": {"token": TOKEN}}],
                  "contexts": [{"name": "cli", "context": {"cluster": "cli", "user": "cli"}}]}
        api, core = _core(config)
        try:
            assert [ns.metadata.name for ns in core.list_namespace().items] == ["default", "kube-system"]
        finally:
            api.close()
        assert _get(info["url"] + "/version", ca_pem, None)[0] == 401
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cli_without_tls_has_no_ca_data(tmp_path):
    seed_path = tmp_path / "seed.json"
    seed_path.write_text(json.dumps({"version": VERSION, "objects": SEED}))
    process, info = serve_seed(tmp_path, seed_path)
    try:
        assert info["url"].startswith("http://127.0.0.1:") and "ca_data" not in info
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(15)


def test_plain_import_does_not_load_cryptography():
    code = "import sys, demo.emulator; assert 'cryptography' not in sys.modules, 'cryptography imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
