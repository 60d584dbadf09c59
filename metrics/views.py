"""``GET /metrics``: the inventory gauges and the request counters in the Prometheus text format."""

from __future__ import annotations

import hmac
import os

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from contract import TOKEN_INVALID
from core import instruments
from core.errors import METHOD_NOT_ALLOWED
from identity.errors import TOKEN_MISSING
from metrics.fleet import inventory_exposition


def _counters() -> bytes:
    """The instruments of every process: summed from PROMETHEUS_MULTIPROC_DIR when set, else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(instruments.REGISTRY)


def _unauthorized(code: str, detail: str) -> JsonResponse:
    response = JsonResponse({"code": code, "detail": detail}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="gshare-metrics"'
    return response


@csrf_exempt  # a scraper has no CSRF cookie; every unsafe method gets the JSON 405 below, not Django's HTML 403
def metrics(request):
    """``GET /metrics`` (internal hosts only, ``gshare.middleware.InternalHostsMiddleware``).

    With ``GSHARE_METRICS_TOKEN`` set the request must carry ``Authorization: Bearer <token>`` (compared in
    constant time); else 401 ``token_missing`` or ``token_invalid``. Answers ``text/plain; version=0.0.4`` (understood by every Prometheus 2.x and 3.x).
    """
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse({"code": METHOD_NOT_ALLOWED, "detail": "Use GET /metrics."}, status=405)
        response["Allow"] = "GET, HEAD"
        return response
    expected = settings.GSHARE_METRICS_TOKEN
    if expected:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        given = given.strip(" \t")  # HTTP's optional whitespace only (str.strip() would also drop control characters)
        if scheme.lower() != "bearer" or not given:
            return _unauthorized(TOKEN_MISSING, "Send the metrics token: Authorization: Bearer <GSHARE_METRICS_TOKEN>.")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return _unauthorized(TOKEN_INVALID, "The metrics token is wrong: use the value of GSHARE_METRICS_TOKEN.")
    body = inventory_exposition() + _counters()
    response = HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
    response["Cache-Control"] = "no-store"
    return response
