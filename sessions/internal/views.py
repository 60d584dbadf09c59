"""Operator- and ingress-facing views of the sessions app."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from jsonschema import Draft202012Validator
from rest_framework.response import Response

import contract
from clusters.internal.views import OperatorAPIView
from contract import rfc3339
from core import instruments
from core.api.base import schema_problems
from core.exceptions import ApplicationError
from sessions import activity, connect, ext_authz, idle, lifecycle
from sessions.errors import INVALID_ACTIVITY, INVALID_STATUS

logger = logging.getLogger(__name__)

_status_validator = Draft202012Validator(contract.STATUS_SCHEMA)
_activity_validator = Draft202012Validator(contract.ACTIVITY_SCHEMA)


def _parse_time(value: str, index: int) -> datetime:
    parsed = rfc3339.parse(value)
    if parsed is None:
        raise ApplicationError(
            f"reports[{index}].observed_at must be an RFC 3339 time with a zone, e.g. 2026-11-29T16:00:00Z; got {value!r}.",
            code=INVALID_STATUS,
        )
    return parsed


class StatusView(OperatorAPIView):
    """``POST /internal/v1/status``: the operator's session phase reports (see docs/contracts.md)."""

    def post(self, request):
        """Apply the reports; answer counts and server time (409 ``report_from_future`` when the operator's clock is
        too far ahead: ``lifecycle.session_status_apply``)."""
        received_at = timezone.now()
        problems = schema_problems(_status_validator, request.data, limit=5)
        if problems:
            raise ApplicationError(f"The status report is malformed: {'; '.join(problems)}. Upgrade the operator to match this control plane.",
                                   code=INVALID_STATUS)
        reports = [{**r, "observed_at": _parse_time(r["observed_at"], i)} for i, r in enumerate(request.data["reports"])]
        result = lifecycle.session_status_apply(cluster=self.cluster, reports=reports, received_at=received_at)
        return Response({**result, "server_time": timezone.now().isoformat()})


class ActivityView(OperatorAPIView):
    """``POST /internal/v1/activity``: the GPU activity of the cluster's Running sessions (``contract.ACTIVITY_PATH``)."""

    def post(self, request):
        """Store the readings, then have the idle policy look at this cluster's sessions (a task, after the commit)."""
        problems = schema_problems(_activity_validator, request.data, limit=5)
        if problems:
            raise ApplicationError(f"The activity report is malformed: {'; '.join(problems)}. Upgrade the operator to match this control plane.",
                                   code=INVALID_ACTIVITY)
        result = activity.activity_report_apply(cluster=self.cluster, entries=request.data["sessions"])
        idle.idle_enforce_soon(cluster=self.cluster)
        return Response({**result, "server_time": timezone.now().isoformat()})


@csrf_exempt
def connect_verify(request):
    """``/internal/connect/verify``: ingress-nginx ``auth-url`` (see ``_connect_verify``), timed in
    ``gshare_connect_verify_duration_seconds`` by outcome."""
    started = time.perf_counter()
    response = _connect_verify(request)
    instruments.connect_verify_observe(response.status_code, time.perf_counter() - started)
    return response


def _connect_verify(request):
    """``/internal/connect/verify``: ingress-nginx ``auth-url``.

    Answers 200 (with ``X-Auth-Request-User`` and maybe ``Set-Cookie``), 401 or 403 with ``{"code", "detail"}``
    (``token_missing``, ``token_invalid``, ``connect_refused``; ``connect_forbidden``), or 503 ``verify_unavailable`` with
    ``Retry-After`` when it cannot decide; never anything else (nginx treats any other answer as an error).
    """
    return _decided(lambda: connect.verify(
        original_url=request.headers.get("X-Original-URL", ""),
        authorization=request.headers.get("Authorization", ""),
        cookie=request.COOKIES.get(connect.COOKIE_NAME, ""),
    ))


@csrf_exempt
def connect_ext_authz(request):
    """``/internal/connect/ext-authz/<original path>`` (any method): Envoy's HTTP ext_authz check of a session request,
    as Envoy Gateway v1.9.0 configures it for the session's ``SecurityPolicy`` (``sessions.ext_authz``), timed in
    ``gshare_connect_verify_duration_seconds`` like the verify.

    Dispatched by ``gshare.middleware.InternalHostsMiddleware`` before the rest of the stack: its ``Host`` is the
    session domain, which ``DJANGO_ALLOWED_HOSTS`` does not list (nothing here calls ``request.get_host()``).

    Answers as ``/internal/connect/verify`` does (200 with ``X-Auth-Request-User``; 401/403 JSON; 503
    ``verify_unavailable``), except that a link opened with ``?token=`` is answered **307** to the same path and
    query without ``token``, with the ``gshare_connect`` cookie: Envoy copies only the listed headers
    (``x-auth-request-user``) of an allowed answer onto the upstream request and none to the client, so a
    ``Set-Cookie`` on a 200 would never reach the browser, while a denial (any answer but 200) goes to the client
    with its status and headers. The browser follows the 307 with the cookie, which a 200 then lets through.
    """
    started = time.perf_counter()
    raw_uri = request.META.get("RAW_URI") or request.META.get("REQUEST_URI")
    if not raw_uri:
        logger.error("connect ext-authz: the web server passes no raw request URI (RAW_URI/REQUEST_URI); run it under gunicorn")
        response = verify_unavailable(connect.VerifyUnavailable(
            "The control plane's web server does not pass the raw request URI (RAW_URI or REQUEST_URI) the ext_authz check "
            "is judged on: run it under gunicorn, as the Helm chart does."
        ))
    else:
        response = _decided(lambda: ext_authz.check(
            raw_uri=raw_uri,
            host=request._get_raw_host(),  # what InternalHostsMiddleware judged; never ALLOWED_HOSTS-checked get_host()
            forwarded_proto=request.headers.get("X-Forwarded-Proto", ""),
            authorization=request.headers.get("Authorization", ""),
            cookie=request.COOKIES.get(connect.COOKIE_NAME, ""),
        ))
    instruments.connect_verify_observe(response.status_code, time.perf_counter() - started)
    return response


def _decided(decide) -> HttpResponse:
    """The HTTP answer of a connect decision: ``decide()`` returns a ``connect.Verdict`` or an ``ext_authz.Check``."""
    try:
        decided = decide()
    except connect.VerifyUnavailable as exc:
        logger.warning("connect verify unavailable: %s", exc.detail)
        return verify_unavailable(exc)
    except Exception:  # a bug must not become a 500 page, nor a 2xx
        logger.exception("connect verify failed")
        return verify_unavailable(connect.VerifyUnavailable(
            f"Connect verification failed unexpectedly; retry in {connect.RETRY_AFTER_SECONDS} s. The control plane's log has the cause."
        ))
    verdict, location = (decided.verdict, decided.location) if isinstance(decided, ext_authz.Check) else (decided, "")
    if verdict.status == 200:
        activity.connection_note(verdict.session)
        if location:
            response = HttpResponse(status=307)
            response["Location"] = location
        else:
            response = HttpResponse(status=200)
            response["X-Auth-Request-User"] = verdict.user
        if verdict.set_cookie:
            name, value, path, max_age = verdict.set_cookie
            response.set_cookie(name, value, max_age=max_age, path=path, secure=True, httponly=True, samesite="Lax")
    else:
        logger.debug("connect refused: %s", verdict.reason)
        response = JsonResponse({"code": verdict.code, "detail": connect.REFUSAL_DETAILS[verdict.code]}, status=verdict.status)
    response["Cache-Control"] = "no-store"
    response["Content-Length"] = str(len(response.content))  # the ext-authz check skips CommonMiddleware, which sets it
    return response


def verify_unavailable(exc: connect.VerifyUnavailable) -> JsonResponse:
    """503 ``verify_unavailable`` with ``Retry-After`` and ``Cache-Control: no-store``."""
    response = JsonResponse(exc.as_body(), status=exc.status)
    response["Retry-After"] = str(exc.retry_after)
    response["Cache-Control"] = "no-store"
    return response
