"""The connect path judge (``sessions.connect_path``) on its own: nginx's URI normalisation and what is refused.

The same judge runs behind a real nginx in ``tests/e2e/test_connect_nginx.py``, which also checks
:func:`nginx_uri` against nginx's own ``$uri``.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.connect_path import PathRefused, nginx_uri, session_in_request_uri

MINE = "ses_mine2345abcdefgh"
YOURS = "ses_yours234abcdefgh"


@pytest.mark.parametrize(
    ("raw", "routed"),
    [
        ("/s/a/b", "/s/a/b"),
        ("/s/a/../b", "/s/b"),
        ("/s/a/b/..", "/s/a/"),
        ("/s/a/./b", "/s/a/b"),
        ("/s/a/.", "/s/a/"),
        ("/s/a/.b/..c", "/s/a/.b/..c"),
        ("/s/a/%2e%2e/b", "/s/b"),
        ("/s/a/%2E%2e/b", "/s/b"),
        ("/s/a/.%2e/b", "/s/b"),
        ("/s/a/%2e/b", "/s/a/b"),
        ("/s/a/..%2fb", "/s/b"),
        ("/s/a%2Fb", "/s/a/b"),
        ("//s///a//b", "/s/a/b"),
        ("/s/a//../b", "/s/b"),
        ("/s/a/%5c..%5cb", "/s/a/\\..\\b"),  # a backslash is an ordinary character on Linux
        ("/s/a/%25", "/s/a/%"),
        ("/s/a/%252e%252e/b", "/s/a/%2e%2e/b"),  # decoded once
        ("/s/a/%23x", "/s/a/#x"),
        ("/s/a/%3fx?y", "/s/a/?x"),
        ("/s/a/%3Fx", "/s/a/?x"),
        ("/s/a/x?../../b", "/s/a/x"),
        ("/s/a/.?x", "/s/a/"),
        ("/s/a/..?x", "/s/"),
        ("/s/a/..#x", "/s/"),
        ("/s/a/x#/../../b", "/s/a/x"),
        ("/%73/a", "/s/a"),
        ("/s/a/%41+b", "/s/a/A+b"),
        ("/s/a/\xe9", "/s/a/\xe9"),
        ("/..", None),
        ("/s/../..", None),
        ("/s/%2e%2e/%2e%2e/x", None),
        ("/s/a/%00", None),
        ("/s/a/%", None),
        ("/s/a/%4", None),
        ("/s/a/%zz", None),
        ("/s/a/%g1", None),
        ("s/a", None),
        ("/s/a b", None),
        ("/s/a\tb", None),
        ("/s/a\x7f", None),
        ("/s/a/\u0100", None),
    ],
)
def test_nginx_uri_normalises_as_nginx(raw, routed):
    assert nginx_uri(raw) == routed


@pytest.mark.parametrize(
    "request_uri",
    [
        f"/s/{MINE}/",
        f"/s/{MINE}",
        f"/s/{MINE}/lab/tree/notebook.ipynb?x=1",
        f"/s/{MINE}/?token=eyJ.abc.def",
        f"/s/{MINE}/api/contents/a%20b%C3%A9",
        f"/s/{MINE}/api/contents/\xe9t\xe9",  # raw latin-1 bytes, as WSGI hands a header over
        f"/s/{MINE}/files/s",  # a file named "s" is no second /s/ segment
        f"/s/{MINE}/x?next=/../../s/{YOURS}/",  # the query is not routed
        f"/s/{MINE}/x#/../../s/{YOURS}/",
        f"/%73/{MINE}/lab",  # nginx routes the decoded path
        "/s/%73es_mine2345abcdefgh/lab",
        f"/s/{MINE}/..x/.y/x../x.",
        f"/s/{MINE}/%252e%252e/",
    ],
)
def test_plain_session_paths_are_accepted(request_uri):
    assert session_in_request_uri(request_uri) == MINE


@pytest.mark.parametrize(
    "request_uri",
    [
        # dot segments, literal and encoded, any case, mixed
        f"/s/{MINE}/../../s/{YOURS}/lab",
        f"/s/{MINE}/../{YOURS}/lab",
        f"/s/{MINE}/./lab",
        f"/s/{MINE}/lab/..",
        f"/s/{MINE}/lab/.",
        f"/s/{MINE}/%2e%2e/%2e%2e/s/{YOURS}/lab",
        f"/s/{MINE}/%2E%2E/%2E%2E/s/{YOURS}/lab",
        f"/s/{MINE}/%2e./.%2E/s/{YOURS}/lab",
        f"/s/{MINE}/file%2etxt",
        f"/s/{MINE}/%2E",
        # encoded slashes and backslashes
        f"/s/{MINE}/..%2f..%2fs/{YOURS}/lab",
        f"/s/{MINE}/..%2F..%2Fs%2F{YOURS}%2Flab",
        f"/s/{MINE}%2f..%2f..%2fs%2f{YOURS}/lab",
        f"/s/{MINE}/..%5c..%5cs/{YOURS}/lab",
        f"/s/{MINE}/..%5C..%5Cs/{YOURS}/lab",
        f"/s/{MINE}/..\\..\\s\\{YOURS}\\lab",
        f"/s/{MINE}/a%00b",
        # empty segments
        f"//s/{MINE}/lab",
        f"/s//{MINE}/lab",
        f"/s/{MINE}//lab",
        f"/s/{MINE}//../../s/{YOURS}/lab",
        # a second /s/ segment, literal or reached by a segment nginx does not treat as a dot
        f"/s/{MINE}/s/{YOURS}/lab",
        f"/s/{MINE}/x/s/{YOURS}/",
        f"/s/{MINE}/%73/{YOURS}/",
        f"/s/{MINE}/s/",
        f"/s/{MINE}/%252e%252e/%252e%252e/s/{YOURS}/lab",
        # not a session path, or not one nginx would route
        "/",
        "/s/",
        "/s",
        f"/S/{MINE}/",
        f"/s/{MINE.upper()}/",
        "/s/other/",
        "/s/ses_/",
        f"/x/s/{MINE}/",
        f"/s/{MINE}/%zz",
        f"/s/{MINE}/%",
        f"/s/{MINE}/a b",
        f"s/{MINE}/",
        "",
    ],
)
def test_ambiguous_or_foreign_paths_are_refused(request_uri):
    with pytest.raises(PathRefused):
        session_in_request_uri(request_uri)


_PIECES = [
    "/", "/", "/", "s", "s", MINE, YOURS, ".", "..", "%2e", "%2E", "%2e%2e", ".%2E", "%2f", "%2F", "%5c", "%5C", "\\",
    "%25", "%252e", "%23", "%3f", "%3F", "%00", "%", "%4", "%73", "%2", "?", "#", "+", "lab", "x", "..;", "%20", "%C3%A9",
]
_MARKERS = re.compile(r"%(?:2e|2f|5c|00)|\\|//", re.IGNORECASE)
uris = st.lists(st.sampled_from(_PIECES), max_size=14).map(lambda parts: "/" + "".join(parts))
session_uris = st.tuples(st.sampled_from([MINE, YOURS]), uris).map(lambda pair: f"/s/{pair[0]}{pair[1]}")


@settings(max_examples=1500, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(uris, session_uris))
def test_an_accepted_path_is_routed_to_the_session_it_names(request_uri):
    """Whatever the pieces, a path the judge accepts for a session is a path nginx routes to that session's location."""
    try:
        session = session_in_request_uri(request_uri)
    except PathRefused:
        return
    routed = nginx_uri(request_uri)
    assert routed == f"/s/{session}" or routed.startswith(f"/s/{session}/"), (request_uri, routed)
    raw_path = re.split(r"[?#]", request_uri, maxsplit=1)[0]
    assert not _MARKERS.search(raw_path), request_uri
    assert "." not in raw_path.split("/") and ".." not in raw_path.split("/"), request_uri
    assert "s" not in routed.split("/")[3:-1], request_uri


@settings(max_examples=500, deadline=None, database=None)
@given(session_uris, st.sampled_from(["..", "%2e%2e", "%2E%2E", "%2e.", ".%2E", "%2f", "%2F", "%5c", "%5C", "//", "\\", f"/s/{YOURS}/"]))
def test_a_marker_anywhere_in_the_path_is_refused(request_uri, marker):
    end = re.search(r"[?#]|$", request_uri).start()  # the marker goes into the routed part, not the query or fragment
    cut = end // 2
    hostile = request_uri[:cut] + ("/../" if marker == ".." else marker) + request_uri[cut:]
    with pytest.raises(PathRefused):
        session_in_request_uri(hostile)
