"""gunicorn's redacting logger (``gshare.access_log``) on hostile shapes: tokens in every place a request can carry one.
The whole path through a real gunicorn, both routing modes: tests/audit/test_no_secrets.py."""

from __future__ import annotations

import datetime
import sys
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from gshare.access_log import REDACTED, RedactingLogger, redact_atoms, redact_text

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ1c2VyOjEifQ.c2lnbmF0dXJl"
API_TOKEN = "gsh_6cc7e670_y8gg8rc-gHEC2PQOXTOpHiorKh"


@pytest.mark.parametrize("text", [
    f"GET /internal/connect/ext-authz/s/ses_x/lab?x=1&token={JWT} HTTP/1.1",
    f"GET /s/ses_x/lab?token={JWT.replace('.', '%2E')}#frag HTTP/1.1",
    f"GET /s/ses_x/lab?a=1;token={JWT} HTTP/1.1",
    f"GET /s/ses_x/lab?{JWT} HTTP/1.1",
    f"GET /s/ses_x/{JWT}/lab HTTP/1.1",
    f"https://gpu-a.example.com/s/ses_x/?token={JWT}",
    f"Invalid request from ip=127.0.0.1: Invalid HTTP request line: 'GET /s/\\xff?token={JWT} HTTP/1.1'",
    f"Mozilla/5.0 {API_TOKEN}",
    "GET /x?k=secret-not-shaped-like-a-token HTTP/1.1",
])
def test_no_token_survives(text):
    out = redact_text(text)
    assert JWT not in out and JWT[:20] not in out and "eyJ" not in out and API_TOKEN not in out
    assert "secret-not-shaped" not in out
    assert REDACTED in out


def test_names_and_paths_stay_readable():
    assert redact_text(f"GET /api/v1/sessions?cluster=lab-c1&limit=10&token={JWT} HTTP/1.1") == (
        "GET /api/v1/sessions?cluster=[redacted]&limit=[redacted]&token=[redacted] HTTP/1.1")
    assert redact_text("GET /api/v1/me HTTP/1.1") == "GET /api/v1/me HTTP/1.1"


def test_credential_headers_go_whole_whatever_the_spelling():
    atoms = {
        "{authorization}i": "Bearer opaque-api-token", "{cookie}i": "gshare_connect=opaque; csrftoken=x",
        "{set-cookie}o": "gshare_connect=opaque; Path=/s/x/; Secure", "{proxy-authorization}i": "Basic dXNlcjpwYXNz",
        "{http_authorization}e": "Bearer opaque-api-token", "{http_cookie}e": "gshare_connect=opaque",
        "{x-csrftoken}i": "opaque", "q": "a=opaque&b", "{query_string}e": "token=opaque", "f": "https://h/?token=opaque",
        "{x-original-url}i": "https://h/s/x/?token=opaque", "{location}o": "/s/x/?token=opaque", "s": "200", "B": 12,
        "{user-agent}i": "curl/8", "{authorization}o": "-",
    }
    out = redact_atoms(atoms)
    assert "opaque" not in repr(out) and "dXNlcjpwYXNz" not in repr(out)
    assert out["s"] == "200" and out["B"] == 12 and out["{user-agent}i"] == "curl/8" and out["{authorization}o"] == "-"
    assert out["q"] == "a=[redacted]&[redacted]"


def test_the_logger_redacts_access_and_error_lines(capsys):
    cfg = Config()
    cfg.set("accesslog", "-")
    cfg.set("errorlog", "-")
    cfg.set("access_log_format", '"%(r)s" %(s)s %(f)s %({cookie}i)s %({x-original-url}i)s')
    logger = RedactingLogger(cfg)
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": f"/internal/connect/ext-authz/s/x/lab?token={JWT}", "SERVER_PROTOCOL": "HTTP/1.1",
               "PATH_INFO": "/internal/connect/ext-authz/s/x/lab", "QUERY_STRING": f"token={JWT}", "HTTP_REFERER": f"https://h/?token={JWT}"}
    request = SimpleNamespace(headers=[("COOKIE", f"gshare_connect={JWT}"), ("X-ORIGINAL-URL", f"https://h/s/x/?token={JWT}")])
    response = SimpleNamespace(status="307 Temporary Redirect", headers=[("Set-Cookie", f"gshare_connect={JWT}")], sent=0)
    logger.access(response, request, environ, datetime.timedelta(seconds=0, microseconds=1500))
    logger.warning("Invalid request from ip=%s: %s", "127.0.0.1", f"Invalid HTTP request line: 'GET /?token={JWT} HTTP/1.1'")
    try:
        raise ValueError(f"bad {JWT}")
    except ValueError:
        logger.exception("Error handling request /s/x/?token=%s", JWT)
    for handler in [*logger.access_log.handlers, *logger.error_log.handlers]:
        handler.flush()
    sys.stdout.flush()
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "/internal/connect/ext-authz/s/x/lab?token=[redacted]" in output and "Invalid request" in output
    assert "ValueError" in output
    assert "eyJ" not in output
