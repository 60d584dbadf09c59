"""The HTTP entry: parsing apiserver URLs into kmock requests, scope checks, and errors rendered as ``Status`` objects
(also inside a watch stream); who may send what is ``demo.emulator.auth``'s."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock._internal.rendering import StreamingError  # not re-exported by kmock 0.8

from demo.emulator.common import truthy
from demo.emulator.errors import ApiError, no_resource, status_document, watch_error
from demo.emulator.resources import ResourceSpec, parse_path, resource_key

logger = logging.getLogger(__name__)


class HttpMixin:
    """aiohttp entry point and request dispatch (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """aiohttp entry point: kmock's ``RawHandler.__call__`` with this module's request parsing.

        kmock 0.8's parser fails on ``/api/v1/namespaces`` (the Namespace collection) and cannot tell a
        Namespace object from a namespaced collection, and its request/error lists grow without bound.
        """
        await raw_request.read()
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = await self._parse_request(raw_request)
            self._requests.append(request)
            if len(self._requests) > self.keep_requests:
                del self._requests[: -self.keep_requests]
            try:
                return await self._handle(request)
            except StreamingError as exc:
                raw_response = exc.args[0]
                raise exc.__cause__ or exc from None
        except Exception as exc:
            if not self._errors:
                raise
            self._errors[-1].append(exc)
            del self._errors[-1][: -self.keep_requests]
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, raw_response)
            await raw_response.write_eof()
            return raw_response

    async def _parse_request(self, raw: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw.read()
        text = body.decode("utf-8", errors="replace")
        data: Any = None
        if body:
            try:
                data = json.loads(text)
            except ValueError:
                if "yaml" in raw.headers.get("Content-Type", ""):
                    try:
                        data = yaml.safe_load(text)
                    except yaml.YAMLError:
                        data = None
        parsed = parse_path(raw.path)
        query = dict(raw.query)
        method = raw.method.upper()
        action: kmock.action | None = None
        resource = None
        if parsed is not None:
            resource = resource_key(parsed.group, parsed.version, parsed.plural)
            if parsed.plural is not None:
                if method == "GET" and truthy(query.get("watch")):
                    action = kmock.action.WATCH
                elif method == "GET":
                    action = kmock.action.FETCH if parsed.name else kmock.action.LIST
                elif method == "POST" and not parsed.name:
                    action = kmock.action.CREATE
                elif method in ("PATCH", "PUT") and parsed.name:
                    action = kmock.action.UPDATE
                elif method == "DELETE":
                    action = kmock.action.DELETE
        # The official client asks for "/version/", "/api/", "/apis/": the apiserver ignores a trailing slash.
        url = raw.url.with_path(raw.path.rstrip("/") or "/", keep_query=True) if raw.path != "/" else raw.url
        return kmock.Request(
            id=len(self._requests), raw_request=raw, url=url, method=raw.method, params=query,
            headers=dict(raw.headers), cookies=dict(raw.cookies), data=data, body=body, text=text,
            action=action, resource=resource,
            namespace=parsed.namespace if parsed else None,
            name=parsed.name if parsed else None,
            subresource=parsed.subresource if parsed else None,
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Authentication, then authorization, then the request (demo.emulator.auth): as the apiserver's filters.
        user = self._authenticate(request)
        self._request_users[id(request)] = user
        try:
            return await self._handle_as(request, user)
        finally:
            self._request_users.pop(id(request), None)

    async def _handle_as(self, request: kmock.Request, user: Any) -> aiohttp.web.StreamResponse:
        if self._is_control(request):  # the emulator's own API: the admin's only, whatever RBAC says
            return await self._serve_control(request, user)
        attrs = self._attributes(request)
        async with self._lock:
            self._authorize(user, attrs)
            self._authorize_apply_create(user, attrs, request)
            answer = self._identity_api(request, user, attrs)
        if answer is not None:
            return self._created(answer)
        if self._is_pod_proxy(request):
            return await self._serve_pod_proxy(request)
        if request.resource is not None and request.resource.plural is not None:
            spec = self._spec(request.resource)
            self._check_scope(spec, request)
            async with self._lock:
                try:
                    outcome = await self._mutate(spec, request)
                except RecursionError:  # copying or merging a document nested too deeply for Python's stack
                    raise ApiError(422, "Invalid", "the object is nested too deeply", None) from None
            if outcome is not None:
                self._outcomes[id(request)] = outcome
        try:
            # Skip KubernetesEmulator._handle (its raw-dict bookkeeping is replaced by _mutate above) and
            # dispatch like kmock does: user reactions first, then the fallbacks, which call _serve_* below.
            return await super(kmock.KubernetesEmulator, self)._handle(request)
        finally:
            self._outcomes.pop(id(request), None)

    def _check_scope(self, spec: ResourceSpec, request: kmock.Request) -> None:
        if not spec.namespaced and request.namespace is not None:
            raise no_resource()
        if spec.namespaced and request.namespace is None and request.name is not None:
            raise no_resource()
        if request.subresource == "log" and (spec.group, spec.plural) == ("", "pods") and request.name is not None:
            if request.action != kmock.action.FETCH:  # pods/log is read-only (GET)
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                               "resource", None)
        elif request.subresource is not None:
            if request.subresource != "status" or "status" not in spec.subresources or request.name is None:
                raise no_resource()
        if spec.verbs == ("create",) and request.action != kmock.action.CREATE:  # the self reviews: POST only
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                           None)
        if request.action is None or (request.action == kmock.action.CREATE and spec.namespaced
                                      and request.namespace is None):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                           None)

    # ----------------------------------------------------------------- errors

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, ApiError):
            return aiohttp.web.json_response(status_document(exc.status, exc.reason or "", exc.message or "", exc.details),
                                             status=exc.status)
        if isinstance(exc, kmock.KubernetesNotFoundError):
            return await self._render_error(no_resource())
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(status_document(exc.status, exc.reason or "", exc.message or "", None),
                                             status=exc.status)
        logger.error("emulator error", exc_info=exc)
        return aiohttp.web.json_response(status_document(500, "InternalError", f"{type(exc).__name__}: {exc}", None),
                                         status=500)

    async def _stream_error(self, exc: Exception, raw_response: aiohttp.web.StreamResponse) -> None:
        if isinstance(exc, ApiError):
            error = watch_error(exc.status, exc.reason or "", exc.message or "")
        else:
            logger.error("emulator watch error", exc_info=exc)
            error = watch_error(500, "InternalError", f"{type(exc).__name__}: {exc}")
        await raw_response.write(json.dumps(error).encode() + b"\n")
