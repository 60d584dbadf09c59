"""Attacks on Envoy's ext_authz check (``/internal/connect/ext-authz/...``) over a real gunicorn.

Tokens in the wrong place or form, path and Host tricks, the 307's ``Location``, oversized headers, concurrency, and
the bound on answering a deregistered cluster's domain (``sessions.ext_authz.DOMAINS_CACHE_SECONDS``). Every request
is written byte for byte (``tests.e2e.test_connect_ext_authz_gunicorn.send``), so gunicorn's ``RAW_URI`` is exactly it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from concurrent.futures import ThreadPoolExecutor
from http.cookies import SimpleCookie
from unittest import mock

import pytest

from clusters.models import Cluster
from identity.keys import signing_key_ensure
from sessions import connect, ext_authz, services
from sessions.models import Session
from tests.e2e.envoy import envoy_proxy  # noqa: F401 -- the fixture
from tests.e2e.gunicorn import INTERNAL_HOST, PUBLIC_HOST, control_plane  # noqa: F401 -- the fixture
from tests.e2e.test_connect_envoy import echo, stack  # noqa: F401 -- the fixtures
from tests.e2e.test_connect_envoy import send as envoy_send
from tests.e2e.test_connect_ext_authz_gunicorn import DOMAIN, PREFIX, code_of, send, sessions  # noqa: F401 -- fixture
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

OTHER_DOMAIN = "gpu-b.example.com"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def _target(session, rest: str = "/") -> bytes:
    return PREFIX + f"/s/{session.public_id}{rest}".encode()


def _cookie_of(url: str, session, link: str) -> str:
    status, headers, _ = send(url, b"GET", _target(session, f"/?token={link}"))
    assert status == 307
    return SimpleCookie(headers["set-cookie"][0])[connect.COOKIE_NAME].value


def _refused(response, code: str = "") -> bool:
    status, headers, body = response
    ok = status in (401, 403) and "x-auth-request-user" not in headers and "set-cookie" not in headers
    return ok and (not code or code_of(body) == code)


def test_tokens_in_the_wrong_place_or_form(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, yours, link = sessions
    cookie = _cookie_of(control_plane, mine, link)
    claims = _claims(link)
    # A cookie token as ?token= or Bearer; a link token as the cookie.
    assert _refused(send(control_plane, b"GET", _target(mine, f"/?token={cookie}")), "token_invalid")
    assert _refused(send(control_plane, b"GET", _target(mine), headers={b"Authorization": b"Bearer " + cookie.encode()}), "token_invalid")
    assert _refused(send(control_plane, b"GET", _target(mine), headers={b"Cookie": f"{connect.COOKIE_NAME}={link}".encode()}),
                    "token_invalid")
    # Another session's cookie on this session's path.
    assert _refused(send(control_plane, b"GET", _target(yours), headers={b"Cookie": f"{connect.COOKIE_NAME}={cookie}".encode()}),
                    "connect_refused")
    # alg none and HS256 keyed with the public key (algorithm confusion), same claims and kid.
    kid = signing_key_ensure().kid
    body = _b64(json.dumps(claims).encode())
    none = f"{_b64(json.dumps({'alg': 'none', 'typ': 'JWT', 'kid': kid}).encode())}.{body}."
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    public = signing_key_ensure().public_key_pem.encode()
    hs256 = f"{head}.{body}.{_b64(hmac.new(public, f'{head}.{body}'.encode(), hashlib.sha256).digest())}"
    for forged in (none, hs256, f"{link}x", link.replace(".", "..", 1), link + "." + link.split(".")[2]):
        assert _refused(send(control_plane, b"GET", _target(mine, f"/?token={forged}")), "token_invalid"), forged
    # A link for this session but another host (the token's host claim is checked, not only the cluster's).
    other_host = connect.link_token_sign(user=mine.owner, session_id=mine.public_id, host=OTHER_DOMAIN)
    assert _refused(send(control_plane, b"GET", _target(mine, f"/?token={other_host}")), "connect_refused")
    # Expired (signed an hour ago, 60 s of life).
    with mock.patch("identity.internal_jwt.time.time", return_value=time.time() - 3600):
        expired = connect.link_token_sign(user=mine.owner, session_id=mine.public_id, host=DOMAIN)
    assert _refused(send(control_plane, b"GET", _target(mine, f"/?token={expired}")), "token_invalid")
    # Only after "#": Envoy never sends a fragment; if one arrives, the token after it is not read.
    assert _refused(send(control_plane, b"GET", _target(mine, f"/#?token={link}")))
    assert _refused(send(control_plane, b"GET", _target(mine, f"/?x=1#&token={link}")), "token_missing")


def test_duplicate_token_parameters(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, yours, link = sessions
    yours_link = services.session_connect(session=yours, user=yours.owner).split("token=")[1]
    # The first one decides; a junk or other-session first token is not skipped in favour of a valid second one.
    assert _refused(send(control_plane, b"GET", _target(mine, f"/?token=junk&token={link}")))
    assert _refused(send(control_plane, b"GET", _target(mine, f"/?token={yours_link}&token={link}")))
    status, headers, _ = send(control_plane, b"GET", _target(mine, f"/lab?token={link}&token=junk&to%6Ben=x&a=1"))
    assert status == 307 and headers["location"] == [f"/s/{mine.public_id}/lab?a=1"]  # every spelling of token dropped


def test_path_tricks_not_in_the_verify_suite(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, yours, link = sessions
    m, y = mine.public_id, yours.public_id
    for path in (f"/s/{m};x/lab", f"/s/{m}/;/../{y}/", f"/s/{m};/../{y}/", f"/s/{y};{m}/",
                 f"/s/{m}/%2e%2e;/{y}/", f"/s/{m}/\\/{y}/", f"/s/{m}%23/../{y}/", f"/s/{m}%3f/../{y}/"):
        assert _refused(send(control_plane, b"GET", PREFIX + f"{path}?token={link}".encode())), path
    # ";" inside the session's own path is just a character (nginx and Envoy route "..;" as a plain segment, to this
    # session's backend): let in, on its own session only.
    for rest in ("/lab;jsessionid=1", f"/..;/{y}/"):
        assert send(control_plane, b"GET", _target(mine, f"{rest}?token={link}"))[0] == 307, rest
    # A raw NUL, CR or a space in the request target: gunicorn refuses the request line, never a 2xx/3xx.
    for raw in (b"/a\x00b", b"/a\rb", b"/a b/c"):
        assert send(control_plane, b"GET", _target(mine, "").rstrip(b"/") + raw + b"?token=" + link.encode())[0] >= 400, raw
    # Absolute-form target naming the session domain or another host: never a check (no Envoy sends it).
    for authority in (DOMAIN, "evil.example", INTERNAL_HOST):
        absolute = f"http://{authority}".encode() + _target(mine, f"/?token={link}")
        assert send(control_plane, b"GET", absolute)[0] in (400, 401, 404), authority


def test_location_stays_on_the_session_path(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, link = sessions
    prefix = f"/s/{mine.public_id}/"
    for rest in (f"?token={link}&next=//evil.example", f"?next=%0d%0aSet-Cookie:x=1&token={link}",
                 f"lab?token={link}&u=http://evil.example/", f"?token={link}&%0d%0a=1", f"?token={link}#//evil.example"):
        status, headers, _ = send(control_plane, b"GET", _target(mine, "/" + rest))
        assert status == 307, rest
        [location] = headers["location"]
        assert location.startswith(prefix) and "\r" not in location and "\n" not in location, location
        assert "token=" not in location and len(headers["set-cookie"]) == 1, location
    # Paths that would turn the Location into a network-path or a backslash reference are refused, never redirected.
    for path in ("//evil.example/s/{m}/", "/\\evil.example/s/{m}/", "/s/{m}/..//evil.example", "/s//evil.example/",
                 "/%2fevil.example/s/{m}/", "/%5cevil.example/s/{m}/"):
        response = send(control_plane, b"GET", PREFIX + path.format(m=mine.public_id).encode() + f"?token={link}".encode())
        assert response[0] != 307 and "location" not in response[1], path


def test_hosts_of_another_cluster_and_their_spellings(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, link = sessions
    ClusterFactory(session_domain=OTHER_DOMAIN)  # registered: the check is answered on it, and refused
    target = _target(mine, f"/?token={link}")
    assert _refused(send(control_plane, b"GET", target, host=OTHER_DOMAIN.encode()), "connect_refused")
    assert _refused(send(control_plane, b"GET", target, host=OTHER_DOMAIN.upper().encode() + b":8443"), "connect_refused")
    # The port is not judged (any digits: the name routes; Envoy's :authority is the client's), only the name.
    for host in (DOMAIN.upper(), DOMAIN + ":443", DOMAIN + ":8443", DOMAIN + ":99999"):
        assert send(control_plane, b"GET", target, host=host.encode())[0] == 307, host
    for host in (DOMAIN + ".", DOMAIN + ".:443", DOMAIN + ":", DOMAIN + ":x", DOMAIN + ":-1", f"carol@{DOMAIN}",
                 f"{DOMAIN},{OTHER_DOMAIN}", f"{DOMAIN}/s/{mine.public_id}/?token={link}&", "[::1]"):
        status, headers, _ = send(control_plane, b"GET", target, host=host.encode())
        assert status in (400, 401, 404) and "set-cookie" not in headers, host
    for raw_host in (DOMAIN.encode() + b"\xff", b"gpu-a.ex\xc3\xa4mple.com", DOMAIN.encode() + b"\x00", b"xn--" + DOMAIN.encode()):
        status, headers, _ = send(control_plane, b"GET", target, host=raw_host)
        assert status in (400, 401, 404) and "set-cookie" not in headers, raw_host
    # Two Host headers (the session's and another): never let in.
    status, headers, _ = send(control_plane, b"GET", target, headers={b"Host": OTHER_DOMAIN.encode()})
    assert status in (400, 401, 404) and "set-cookie" not in headers
    # X-Forwarded-Host is not read (USE_X_FORWARDED_HOST is off): neither to reach the check on the public host ...
    status, _, body = send(control_plane, b"GET", target, host=PUBLIC_HOST.encode(), headers={b"X-Forwarded-Host": DOMAIN.encode()})
    assert (status, code_of(body)) == (404, "not_found")
    # ... nor to move a session-domain check to another host.
    assert send(control_plane, b"GET", target, headers={b"X-Forwarded-Host": OTHER_DOMAIN.encode()})[0] == 307
    # A second X-Forwarded-Proto (send() writes https) other than http/https: gunicorn refuses conflicting scheme
    # headers (400), or the check refuses a scheme it would put into the rebuilt URL (401): never let in.
    for proto in (b"javascript", b"https://evil.example/", b"ftp"):
        assert send(control_plane, b"GET", target, headers={b"X-Forwarded-Proto": proto})[0] in (400, 401), proto


def test_huge_headers_are_refused_before_the_view(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, link = sessions
    cookie = _cookie_of(control_plane, mine, link)
    for headers in ({b"Cookie": b"a=" + b"x" * 20000 + f"; {connect.COOKIE_NAME}={cookie}".encode()},
                    {b"Authorization": b"Bearer " + b"x" * 20000},
                    {f"X-{i}".encode(): b"y" * 100 for i in range(150)}):
        status, response_headers, _ = send(control_plane, b"GET", _target(mine), headers=headers)
        assert status in (400, 401, 431), status
        assert "x-auth-request-user" not in response_headers


def test_many_concurrent_checks_each_get_their_own_verdict(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, yours, link = sessions
    cookie = _cookie_of(control_plane, mine, link)
    with_cookie = {b"Cookie": f"{connect.COOKIE_NAME}={cookie}".encode()}

    def one(i: int) -> tuple[int, int]:
        if i % 3 == 0:
            return 200, send(control_plane, b"GET", _target(mine, f"/lab/{i}"), headers=with_cookie)[0]
        if i % 3 == 1:
            return 401, send(control_plane, b"GET", _target(yours, f"/lab/{i}"), headers=with_cookie)[0]
        return 401, send(control_plane, b"GET", _target(mine, f"/lab/{i}"))[0]

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, range(150)))
    assert all(expected == got for expected, got in results), [r for r in results if r[0] != r[1]][:5]


def test_a_deregistered_clusters_domain_stops_being_answered_within_the_bound(control_plane, sessions):  # noqa: F811
    mine, _yours, link = sessions
    target = _target(mine, f"/?token={link}")
    assert send(control_plane, b"GET", target)[0] == 307  # the process has read the set of domains
    Cluster.objects.filter(pk=mine.cluster_id).update(status="deregistered")
    changed = time.monotonic()
    while True:
        status, _, body = send(control_plane, b"GET", target)
        elapsed = time.monotonic() - changed
        if status == 404:
            assert code_of(body) == "not_found"
            break
        assert status in (307, 401) and elapsed < ext_authz.DOMAINS_CACHE_SECONDS + 1.0, (status, elapsed)
        time.sleep(0.2)
    for _ in range(5):  # and never again
        assert send(control_plane, b"GET", target)[0] == 404


def test_the_public_and_internal_hosts(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, link = sessions
    target = _target(mine, f"/?token={link}")
    for host in (PUBLIC_HOST, PUBLIC_HOST.upper(), PUBLIC_HOST + ".", PUBLIC_HOST + ":443"):
        status, _, body = send(control_plane, b"GET", target, host=host.encode())
        assert (status, code_of(body)) == (404, "not_found"), host
    assert _refused(send(control_plane, b"GET", target, host=INTERNAL_HOST.encode()), "connect_refused")
    assert Session.objects.get(pk=mine.pk).phase == Session.Phase.RUNNING


def test_through_a_real_envoy_no_trick_reaches_the_other_sessions_backend(stack):  # noqa: F811 -- the fixture
    """The same attacks in front of a real Envoy (``tests.e2e.envoy``): whatever Envoy answers, ``yours``'s backend
    never sees a request carrying only ``mine``'s token, and no 307 leaves the session's path."""
    mine, yours, proxy, token = stack["mine"], stack["yours"], stack["envoy"], stack["token"]
    m, y = mine.public_id, yours.public_id
    theirs = stack["backends"][y]
    targets = [f"/s/{m}/..;/{y}/", f"/s/{m};/../{y}/", f"/s/{y};{m}/", f"/s/{m}/%2e%2e;/{y}/", f"/s/{m}/.%2e/{y}/",
               f"/s/{m}%2f..%2f{y}/", f"/s/{m}/..%5c{y}/", f"//s/{m}/../../s/{y}/", f"/s/{m}/%252e%252e/{y}/",
               f"http://{DOMAIN}/s/{y}/", f"http://evil.example/s/{y}/", f"/s/{m}/?next=//evil.example&a=%0d%0a"]
    for target in targets:
        status, headers, _ = envoy_send(proxy, "GET", f"{target}{'&' if '?' in target else '?'}token={token}".encode())
        location = headers.get("Location") or ""
        if status == 307:
            assert location.startswith(("/s/", f"https://{DOMAIN}/s/", f"http://{DOMAIN}/s/")), (target, location)
            # Envoy's own UNESCAPE_AND_REDIRECT 307 may point at /s/<yours>/?token=...: followed, it is refused.
            envoy_send(proxy, "GET", location.encode() if location.startswith("/") else b"/" + location.split("/", 3)[3].encode())
        assert not theirs.seen, (target, status, theirs.seen, proxy.log_tail())
        # Bearer, the same spelling: never the other backend either.
        envoy_send(proxy, "GET", target.encode(), {"Authorization": f"Bearer {token}"})
        assert not theirs.seen, (target, theirs.seen)
    # Two Host headers, or a huge cookie: Envoy refuses; nothing reaches a backend without a check.
    status, _, _ = envoy_send(proxy, "GET", f"/s/{y}/".encode(), {"Host": DOMAIN, "Authorization": f"Bearer {token}"})
    assert status >= 400 and not theirs.seen
    status, _, _ = envoy_send(proxy, "GET", f"/s/{m}/".encode(), {"Cookie": "a=" + "x" * 70000})
    assert status >= 400


def test_the_control_plane_urls_host_is_never_a_session_domain_even_with_allowed_hosts_star(client, settings):
    """A cluster row whose ``session_domain`` is the host of ``GSHARE_CONTROL_PLANE_URL`` (registered before the URL
    changed: registration refuses it now) is not answered there, with ``DJANGO_ALLOWED_HOSTS=*`` too."""
    settings.ALLOWED_HOSTS = ["*"]
    settings.GSHARE_CONTROL_PLANE_URL = "https://GShare.Example.COM.:8443/"
    ext_authz.forget_session_domains()
    ClusterFactory(session_domain="gshare.example.com")
    ClusterFactory(session_domain=OTHER_DOMAIN)
    raw = PREFIX.decode() + "/s/ses_abc/"
    for host, status in (("gshare.example.com", 404), ("GSHARE.example.com.:443", 404), (OTHER_DOMAIN, 401)):
        assert client.get(raw, HTTP_HOST=host, RAW_URI=raw).status_code == status, host
    ext_authz.forget_session_domains()
