"""Kubeconfig validation against the real-world variants in tests/fixtures/kubeconfig/."""

import pytest
import yaml

from kube.kubeconfig import KubeconfigError, is_loopback_host, validate_kubeconfig
from tests.helpers import load_kubeconfig_fixture


@pytest.mark.parametrize(
    ("fixture", "code"),
    [
        ("eks-exec-aws-eks-get-token.yaml", "kubeconfig_exec_forbidden"),
        ("gke-exec-gke-gcloud-auth-plugin.yaml", "kubeconfig_exec_forbidden"),
        ("gke-legacy-auth-provider-gcp.yaml", "kubeconfig_exec_forbidden"),
        ("oidc-auth-provider.yaml", "kubeconfig_exec_forbidden"),
        ("ca-file-paths-minikube.yaml", "kubeconfig_local_file"),
        ("multi-context-empty-current-context.yaml", "kubeconfig_invalid"),
        ("kubectl-config-view-redacted.yaml", "kubeconfig_invalid"),
        ("k3s.yaml", "kubeconfig_localhost"),
    ],
)
def test_refused_fixtures(fixture, code):
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(load_kubeconfig_fixture(fixture))
    assert info.value.code == code
    assert info.value.status == 400
    assert len(info.value.detail) > 40  # a sentence that names the fix


@pytest.mark.parametrize("fixture", ["kubeadm-admin.conf", "insecure-skip-tls-verify.yaml"])
def test_accepted_fixtures_reduce_to_current_context(fixture):
    valid = validate_kubeconfig(load_kubeconfig_fixture(fixture))
    assert valid.server.startswith("https://10.0.0.")
    assert len(valid.config["contexts"]) == 1
    assert valid.config["current-context"] == valid.context
    assert yaml.safe_load(valid.as_yaml()) == valid.config


def test_current_context_is_used_not_the_first():
    # The first context points at CA and client-certificate files; the current one (last) does not.
    valid = validate_kubeconfig(load_kubeconfig_fixture("multi-context-current-not-first.yaml"))
    assert valid.context == "exp-test"
    assert valid.server == "https://10.0.0.51"
    assert [c["name"] for c in valid.config["clusters"]] == ["test"]
    assert [u["name"] for u in valid.config["users"]] == ["experimenter"]


def test_token_auth_with_a_real_token_is_accepted_and_redacted_token_refused():
    text = load_kubeconfig_fixture("token-auth.yaml")
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(text)  # `token: REDACTED` is what `kubectl config view` prints
    assert info.value.code == "kubeconfig_invalid"
    valid = validate_kubeconfig(text.replace("token: REDACTED", "token: eyJhbGciOiJSUzI1NiJ9.e30.c2ln"))
    assert valid.config["contexts"][0]["context"]["namespace"] == "gshare-system"


def test_token_file_is_refused_without_reading_it(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("never-read")
    text = load_kubeconfig_fixture("token-auth.yaml").replace("token: REDACTED", f"tokenFile: {secret}")
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(text)
    assert info.value.code == "kubeconfig_local_file"
    assert "tokenFile" in info.value.detail


@pytest.mark.parametrize(
    "text",
    ["", "::: not yaml :::\n  - [", "- just\n- a list\n", "apiVersion: v1\nkind: Config\n"],
)
def test_garbage_is_invalid(text):
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(text)
    assert info.value.code == "kubeconfig_invalid"


def test_missing_cluster_and_user_are_named():
    data = yaml.safe_load(load_kubeconfig_fixture("kubeadm-admin.conf"))
    data["users"] = []
    with pytest.raises(KubeconfigError, match="not defined under `users`"):
        validate_kubeconfig(yaml.safe_dump(data))
    data = yaml.safe_load(load_kubeconfig_fixture("kubeadm-admin.conf"))
    data["clusters"][0]["name"] = "other"
    with pytest.raises(KubeconfigError, match="not defined under `clusters`"):
        validate_kubeconfig(yaml.safe_dump(data))


@pytest.mark.parametrize(
    "server",
    ["https://127.0.0.1:6443", "https://127.8.9.10", "https://[::1]:6443", "https://localhost:6443",
     "https://0.0.0.0:6443", "https://[::]:6443", "https://[::ffff:127.0.0.1]:6443", "https://api.localhost"],
)
def test_loopback_servers_are_refused(server):
    data = yaml.safe_load(load_kubeconfig_fixture("kubeadm-admin.conf"))
    data["clusters"][0]["cluster"]["server"] = server
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(yaml.safe_dump(data))
    assert info.value.code == "kubeconfig_localhost"


def test_allowlist_lets_exactly_one_host_port_through():
    data = yaml.safe_load(load_kubeconfig_fixture("kubeadm-admin.conf"))
    data["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:34567"
    text = yaml.safe_dump(data)
    assert validate_kubeconfig(text, loopback_allowlist=["127.0.0.1:34567"]).server == "http://127.0.0.1:34567"
    with pytest.raises(KubeconfigError):
        validate_kubeconfig(text, loopback_allowlist=["127.0.0.1:34568"])


def test_is_loopback_host_keeps_real_names():
    assert not is_loopback_host("k8s.example.com")
    assert not is_loopback_host("10.0.0.1")
    assert is_loopback_host("LOCALHOST")


def _with(server=None, user=None, cluster_extra=None):
    data = yaml.safe_load(load_kubeconfig_fixture("kubeadm-admin.conf"))
    if server is not None:
        data["clusters"][0]["cluster"]["server"] = server
    if user is not None:
        data["users"][0]["user"] = user
    if cluster_extra:
        data["clusters"][0]["cluster"].update(cluster_extra)
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    "server",
    ["https://2130706433:6443", "https://0x7f000001:6443", "https://127.1:6443", "https://0177.0.0.1:6443",
     "https://0:6443", "https://localhost.:6443", "https://127.0.0.1.:6443", "https://169.254.169.254",
     "https://[fe80::1]:6443"],
)
def test_other_spellings_of_local_addresses_are_refused(server):
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(_with(server=server))
    assert info.value.code == "kubeconfig_localhost"


@pytest.mark.parametrize(
    ("server", "fragment"),
    [("https://admin:pw@10.0.0.10:6443", "credentials"), ("https://10.0.0.10:99999", "port"),
     ("https://10.0.0.10:abc", "port"), ("http://10.0.0.10:6443", "plain http"), ("https://10.0.0.10:6443/x?token=y", "path")],
)
def test_malformed_or_unsafe_servers_are_refused(server, fragment):
    with pytest.raises(KubeconfigError, match=fragment) as info:
        validate_kubeconfig(_with(server=server))
    assert info.value.code == "kubeconfig_invalid"


def test_proxy_url_and_header_injection_are_refused():
    with pytest.raises(KubeconfigError, match="proxy-url"):
        validate_kubeconfig(_with(cluster_extra={"proxy-url": "http://127.0.0.1:3128"}))
    with pytest.raises(KubeconfigError, match="single-line"):
        validate_kubeconfig(_with(user={"token": "abc\r\nX-Injected: 1"}))


def test_unknown_keys_and_alias_bombs_are_not_stored():
    text = _with() + "\n"
    data = yaml.safe_load(text)
    data["clusters"][0]["cluster"]["extensions"] = [{"name": "x", "extension": {"a": 1}}]
    data["users"][0]["user"]["bomb"] = [["lol"] * 9] * 9
    valid = validate_kubeconfig(yaml.safe_dump(data))
    assert "extensions" not in valid.as_yaml() and "bomb" not in valid.as_yaml()
    with pytest.raises(KubeconfigError):
        validate_kubeconfig("[" * 20000)
