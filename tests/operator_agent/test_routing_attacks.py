"""Attacks on ``spec.extAuthUrl``: values that would make the session's Backend (where Envoy sends every check) point
somewhere other than what the URL says are refused by ``ext_auth_target``, never silently rewritten."""

from __future__ import annotations

import pytest

from contract import CONNECT_EXT_AUTHZ_PATH as P
from operator_agent.manifests import routing
from operator_agent.manifests.routing.envoy_gateway import ext_auth_target
from tests.operator_agent.test_routing import gss

REFUSED = {
    # userinfo and fragment tricks: the host a reader sees is not the one parsed
    "userinfo": "http://cp.example.com@evil.example" + P,
    "empty-userinfo": "http://@evil.example" + P,
    "fragment-at": "http://evil.example#@cp.example.com" + P,
    "backslash-at": "http://cp.example.com\\@evil.example" + P,
    "query-at": "http://evil.example?@cp.example.com" + P,
    # characters urlsplit drops or strips: "ev\nil" is "evil" to it
    "newline-in-host": "http://cp.exa\nmple.com" + P,
    "tab-in-host": "http://evil.example\t.cp.example.com" + P,
    "leading-space": " http://cp.example.com" + P,
    "leading-nul": "\x00http://cp.example.com" + P,
    "trailing-newline": "http://cp.example.com" + P + "\n",
    "cr-in-path": "http://cp.example.com/internal\r/connect/ext-authz",
    # bracketed hosts Python 3.11 takes loosely
    "junk-after-bracket": "http://[::1]evil.example" + P,
    "ipvfuture": "http://[v1.evil]" + P,
    "bracketed-ipv4": "http://[127.0.0.1]" + P,
    "bracketed-name": "http://[cp.example.com]" + P,
    "ipv6-zone": "http://[fe80::1%25eth0]" + P,
    "ipv6-zone-unencoded": "http://[fe80::1%eth0]" + P,
    "unbracketed-ipv6": "http://::1" + P,
    # IPv4 in the forms resolvers and WHATWG parsers read as addresses, but ipaddress does not
    "ipv4-short": "http://127.1" + P,
    "ipv4-hex": "http://0x7f000001" + P,
    "ipv4-decimal": "http://2130706433" + P,
    "ipv4-octal-dotted": "http://0177.0.0.1" + P,
    "ipv4-trailing-dot": "http://10.96.0.15." + P,
    "zero": "http://0" + P,
    "name-ending-in-number": "http://cp.example.1" + P,
    # unicode and IDNA: only the xn-- form
    "unicode": "http://bücher.example" + P,
    "fullwidth-dot": "http://cp.example.com\uff0eevil.example" + P,
    "cyrillic-a": "http://ex\u0430mple.com" + P,
    "idna-dots": "http://cp\u3002evil.example" + P,
    # ports
    "port-negative": "http://cp.example.com:-1" + P,
    "port-huge": "http://cp.example.com:65536" + P,
    "port-very-huge": "http://cp.example.com:99999999999999999999" + P,
    "port-unicode-digits": "http://cp.example.com:\u0668\u0660" + P,
    "port-plus": "http://cp.example.com:+80" + P,
    "two-ports": "http://cp.example.com:80:81" + P,
    # paths a proxy on the way would rewrite
    "dot-dot": "http://cp.example.com/internal/../api/v1" + P,
    "dot": "http://cp.example.com/./internal/connect/ext-authz",
    "encoded-dot-dot": "http://cp.example.com/internal/%2e%2e/api",
    "encoded-slash": "http://cp.example.com/internal%2Fconnect/ext-authz",
    "encoded-backslash": "http://cp.example.com/internal%5cconnect",
    "encoded-nul": "http://cp.example.com/internal%00/connect",
}


@pytest.mark.parametrize("url", REFUSED.values(), ids=REFUSED.keys())
def test_misleading_ext_auth_urls_are_refused(url):
    with pytest.raises(routing.RoutingError, match="extAuthUrl"):
        ext_auth_target(url)
    with pytest.raises(routing.RoutingError):
        routing.routing_objects(gss(extAuthUrl=url))


@pytest.mark.parametrize(("url", "host", "kind", "port"), [
    ("http://cp.example.com" + P, "cp.example.com", "fqdn", 80),
    ("https://CP.Example.COM." + P, "cp.example.com.", "fqdn", 443),
    ("http://xn--bcher-kva.example:8000" + P, "xn--bcher-kva.example", "fqdn", 8000),
    ("http://gshare-api.gshare.svc.cluster.local:8000" + P, "gshare-api.gshare.svc.cluster.local", "fqdn", 8000),
    ("http://10.96.0.15:8000" + P, "10.96.0.15", "ip", 8000),
    ("http://[fd00::a]" + P, "fd00:0000:0000:0000:0000:0000:0000:000a", "ip", 80),
    ("http://cp.example.com:" + P, "cp.example.com", "fqdn", 80),
    ("http://1x.example.com" + P, "1x.example.com", "fqdn", 80),
])
def test_plain_urls_still_pass(url, host, kind, port):
    target = ext_auth_target(url)
    assert (target.host, target.kind, target.port, target.path) == (host, kind, port, P)
