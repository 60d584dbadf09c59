"""Every key a kubeconfig keeps is type-checked, tokens must fit in an HTTP header, and YAML alias bombs are
refused before their aliases are expanded: all 400 ``kubeconfig_invalid`` naming the key and the fix, before anything
is dialled or stored."""

from __future__ import annotations

import base64
import copy

import pytest
import yaml

from clusters.models import Cluster
from kube import api_client_for_kubeconfig
from kube import kubeconfig as kubeconfig_module
from kube.kubeconfig import MAX_EXPANDED_NODES, KubeconfigError, validate_kubeconfig
from tests.helpers import kubeconfig_text

GOOD = {
    "apiVersion": "v1", "kind": "Config", "current-context": "x",
    "clusters": [{"name": "c", "cluster": {"server": "https://k8s.example.com:6443",
                                           "certificate-authority-data": base64.b64encode(b"x").decode()}}],
    "users": [{"name": "u", "user": {"token": "eyJhbGciOiJSUzI1NiJ9.e30.c2ln"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
}


def kubeconfig(cluster: dict | None = None, user: dict | None = None, base: dict | None = None) -> str:
    data = copy.deepcopy(base or GOOD)
    data["clusters"][0]["cluster"].update(cluster or {})
    if user is not None:
        data["users"][0]["user"] = user
    return yaml.safe_dump(data)


def bomb(levels: int = 9, width: int = 9) -> str:
    """A billion-laughs document: each anchor lists ``width`` aliases of the previous one."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def refused(text: str) -> KubeconfigError:
    with pytest.raises(KubeconfigError) as info:
        validate_kubeconfig(text)
    assert info.value.code == "kubeconfig_invalid"
    assert info.value.status == 400
    return info.value


# --------------------------------------------------------------------------- types


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, ["a"], {"a": 1}, None])
def test_insecure_skip_tls_verify_must_be_a_real_boolean(value):
    error = refused(kubeconfig(cluster={"insecure-skip-tls-verify": value}))
    assert "`insecure-skip-tls-verify` must be a YAML boolean" in error.detail
    assert "unquoted" in error.detail


@pytest.mark.parametrize("value", [True, False])
def test_insecure_skip_tls_verify_booleans_are_kept(value):
    valid = validate_kubeconfig(kubeconfig(cluster={"insecure-skip-tls-verify": value}))
    assert valid.config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] is value
    api = api_client_for_kubeconfig(valid.config)
    assert api.configuration.verify_ssl is (not value)
    api.close()


def test_unquoted_yaml_false_keeps_tls_verification_on():
    text = kubeconfig().replace("    server:", "    insecure-skip-tls-verify: false\n    server:")
    valid = validate_kubeconfig(text)
    api = api_client_for_kubeconfig(valid.config)
    assert api.configuration.verify_ssl is True
    api.close()


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("cluster", "server", ["https://k8s.example.com:6443"]),
        ("cluster", "tls-server-name", ["a"]),
        ("cluster", "tls-server-name", 42),
        ("cluster", "certificate-authority-data", ["a"]),
        ("cluster", "certificate-authority-data", {"a": 1}),
        ("user", "token", {"a": 1}),
        ("user", "token", 12345),
        ("user", "token", ["t"]),
        ("user", "client-certificate-data", True),
        ("user", "username", 7),
        ("user", "password", ["p"]),
    ],
)
def test_kept_keys_must_be_strings(section, key, value):
    if section == "cluster":
        text = kubeconfig(cluster={key: value})
    else:
        user = {"token": "t", "client-certificate-data": "eA==", "client-key-data": "eA==", "username": "a", "password": "b"}
        text = kubeconfig(user={**user, key: value})
    error = refused(text)
    assert f"The {section}'s `{key}` must be a string" in error.detail
    assert "kubectl config view" in error.detail


@pytest.mark.parametrize("key", ["certificate-authority-data"])
def test_data_must_be_base64(key):
    error = refused(kubeconfig(cluster={key: "not base64 !!"}))
    assert f"`{key}` is not valid base64" in error.detail


def test_context_names_must_be_strings():
    data = copy.deepcopy(GOOD)
    data["contexts"][0]["context"]["cluster"] = ["c"]
    data["clusters"][0]["name"] = ["c"]
    error = refused(yaml.safe_dump(data))
    assert "The `cluster` of context 'x' must be a string" in error.detail


# --------------------------------------------------------------------------- header safety


@pytest.mark.parametrize("token", ["tok\u2603en", "tok\u00e9en", "tok\ten", "tok\x7fen", "\u200beyJ"])
def test_tokens_must_be_printable_ascii(token):
    error = refused(kubeconfig(user={"token": token}))
    assert "`token` contains a character that is not printable ASCII" in error.detail


def test_line_breaks_in_a_token_are_still_header_injection():
    error = refused(kubeconfig(user={"token": "abc\r\nX-Injected: 1"}))
    assert "single-line" in error.detail


@pytest.mark.parametrize("key", ["username", "password"])
def test_basic_credentials_must_fit_in_a_header(key):
    user = {"username": "admin", "password": "pässword"}  # Latin-1 is fine
    validate_kubeconfig(kubeconfig(user=user))
    error = refused(kubeconfig(user={**user, key: "snow\u2603man"}))
    assert f"`{key}` contains a character that cannot be sent in an HTTP header" in error.detail


# --------------------------------------------------------------------------- YAML aliases


@pytest.fixture
def constructed(monkeypatch) -> list[int]:
    """One entry per YAML document the kubeconfig loader turned into Python objects (where a bomb's aliases would be
    expanded), from any thread."""
    calls: list[int] = []
    loader = kubeconfig_module._KubeconfigLoader
    real = loader.construct_document

    def spy(self, node):
        calls.append(1)
        return real(self, node)

    monkeypatch.setattr(loader, "construct_document", spy)
    return calls


def test_an_alias_bomb_is_refused_before_it_is_expanded(constructed):
    text = bomb() + kubeconfig(cluster={"insecure-skip-tls-verify": "__BOMB__"}).replace("'__BOMB__'", "*l9").replace("__BOMB__", "*l9")
    error = refused(text)
    assert f"expand to more than {MAX_EXPANDED_NODES} nodes" in error.detail
    assert "`&anchor` / `*alias`" in error.detail
    assert constructed == []  # refused on the composed node graph: no alias was expanded into objects
    validate_kubeconfig(kubeconfig())
    assert constructed == [1]  # the spy sees the loader's construction


def test_an_unused_alias_bomb_is_refused_too(constructed):
    refused(bomb() + kubeconfig())
    assert constructed == []


def test_a_self_referencing_alias_is_refused():
    error = refused("loop: &loop [*loop]\n" + kubeconfig())
    assert "refers to the node that contains it" in error.detail


def test_a_few_aliases_are_still_accepted():
    """PyYAML's own ``safe_dump`` writes anchors for shared lists; a small document with some is fine."""
    data = copy.deepcopy(GOOD)
    data["preferences"] = {"shared": [["lol"] * 9] * 9}
    text = yaml.safe_dump(data)
    assert "*id" in text
    validate_kubeconfig(text)


# --------------------------------------------------------------------------- through the API


@pytest.mark.django_db
def test_api_refuses_wrong_types_bad_tokens_and_bombs_without_changing_anything(http, fleet_cluster, settings, constructed):
    emulated = fleet_cluster("lab-c1")
    response = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(emulated), "session_domain": "a.example.com"})
    assert response.status_code == 201, response.text
    cluster_id = response.json()["id"]
    before = Cluster.objects.get(public_id=cluster_id)
    good = emulated.kubeconfig("lab")
    cases = {
        "skip_tls_string": (kubeconfig(cluster={"insecure-skip-tls-verify": "false"}, base=good), "insecure-skip-tls-verify"),
        "tls_server_name_list": (kubeconfig(cluster={"tls-server-name": ["a"]}, base=good), "tls-server-name"),
        "token_non_latin": (kubeconfig(user={"token": "tok\u2603en"}, base=good), "not printable ASCII"),
        "token_dict": (kubeconfig(user={"token": {"a": 1}}, base=good), "`token` must be a string"),
        "bomb": (bomb() + kubeconfig(base=good), "aliases"),
    }
    for name, (text, fragment) in cases.items():
        documents_before = len(constructed)
        for method, path, body in (
            ("post", "/api/v1/clusters", {"name": f"new-{name}".replace("_", "-"), "kubeconfig": text}),
            ("patch", f"/api/v1/clusters/{cluster_id}", {"kubeconfig": text, "session_domain": "changed.example.com"}),
        ):
            response = getattr(http, method)(path, json=body)
            assert response.status_code == 400, (name, method, response.text)
            assert response.json()["code"] == "kubeconfig_invalid", (name, method, response.text)
            assert fragment in response.json()["detail"], (name, method, response.text)
        if name == "bomb":  # refused on its node graph, its aliases never expanded into objects
            assert len(constructed) == documents_before, "the bomb's aliases were expanded before it was refused"
    after = Cluster.objects.get(public_id=cluster_id)
    assert (after.kubeconfig, after.apiserver_url, after.session_domain) == (before.kubeconfig, before.apiserver_url, "a.example.com")
    assert Cluster.objects.count() == 1
