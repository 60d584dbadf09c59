"""Authentication and authorization of each request (part of ``KubeApiEmulator``), and the APIs about identity.

Identities:

* the admin token (``token``): user ``kubernetes-admin`` in ``system:masters``, cluster-admin, never checked by RBAC
  (as a kubeadm admin kubeconfig); with ``token`` None every request without a ServiceAccount token is that admin;
* ServiceAccount tokens: user ``system:serviceaccount:<namespace>:<name>`` (groups ``system:serviceaccounts``,
  ``system:serviceaccounts:<namespace>``, ``system:authenticated``), authorized by RBAC (``demo.emulator.rbac``) on
  every request. A token comes from a Secret of type ``kubernetes.io/service-account-token`` annotated
  ``kubernetes.io/service-account.name`` (filled by the tokens controller stand-in right after create: ``data.token``,
  ``data.namespace``, ``data.ca.crt`` with TLS, annotation ``kubernetes.io/service-account.uid``; it never expires
  and is revoked by deleting the Secret or the ServiceAccount; a token written into such a Secret by anyone else
  authenticates nobody, as a real one is a JWT the apiserver signed), or from a TokenRequest (``POST
  .../serviceaccounts/<name>/token``, ``authentication.k8s.io/v1``: expires after ``spec.expirationSeconds``, default
  3600, at least 600, revoked with the ServiceAccount). Tokens are opaque random strings, not JWTs.

A request RBAC does not allow gets the apiserver's ``403 Forbidden`` Status. ``SelfSubjectAccessReview`` and
``SelfSubjectRulesReview`` (``authorization.k8s.io/v1``, ``POST``) answer for the caller's identity.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import hmac
import secrets
import time
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import kmock

from demo.emulator import rbac
from demo.emulator.common import header_value, truthy
from demo.emulator.errors import ApiError
from demo.emulator.rbac import ADMIN, RBAC_GROUP, Attributes, UserInfo

SERVICE_ACCOUNT_TOKEN_TYPE = "kubernetes.io/service-account-token"
SERVICE_ACCOUNT_NAME_ANNOTATION = "kubernetes.io/service-account.name"
SERVICE_ACCOUNT_UID_ANNOTATION = "kubernetes.io/service-account.uid"
AUTHORIZATION_GROUP = "authorization.k8s.io"
_MIN_TOKEN_SECONDS = 600  # the apiserver refuses a shorter expirationSeconds
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode("ascii")


def _decoded(value: Any) -> str:
    try:
        return base64.b64decode(str(value), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""


class AuthMixin:
    """Who sends a request and what it may do (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    # ----------------------------------------------------------------- authentication

    def _authenticate(self, request: kmock.Request) -> UserInfo:
        """The identity of the request's bearer token; raises ``401 Unauthorized`` for an unknown one."""
        header = header_value(request.headers, "Authorization")
        scheme, _, presented = header.partition(" ")
        presented = presented.strip() if scheme.lower() == "bearer" else ""
        if self.token is not None and presented and hmac.compare_digest(presented.encode(), self.token.encode()):
            return ADMIN
        user = self._service_account_for(presented) if presented else None
        if user is not None:
            return user
        if self.token is None:
            return ADMIN
        raise ApiError(401, "Unauthorized", "Unauthorized", None)

    def _service_account_for(self, token: str) -> UserInfo | None:
        accounts = self.served("", "v1", "serviceaccounts")
        issued = self._issued_tokens.get(token)
        if issued is not None:
            namespace, name, uid, expires = issued
            if expires <= time.time():
                del self._issued_tokens[token]
                return None
        else:
            # Only a token the tokens controller wrote counts (a real one is a JWT the apiserver signed, so a string put
            # into a token Secret by whoever may create Secrets authenticates nobody), and only while its Secret still
            # holds it; the ServiceAccount is the one it was written for (the JWT's claims), whatever the Secret's
            # annotations say now.
            written = self._secret_tokens.get(token)
            if written is None:
                return None
            namespace, secret_name, name, uid = written
            secret = self.get_object(self.served("", "v1", "secrets"), namespace, secret_name)
            if (secret is None or secret.get("type") != SERVICE_ACCOUNT_TOKEN_TYPE
                    or not hmac.compare_digest(_decoded((secret.get("data") or {}).get("token")).encode(), token.encode())):
                return None
        account = self.get_object(accounts, namespace, name)
        if account is None or account["metadata"]["uid"] != uid:
            return None  # the ServiceAccount was deleted (and maybe re-created): its tokens are revoked
        return rbac.service_account_user(namespace, name, account["metadata"]["uid"])

    def fill_token_secret(self, obj: dict[str, Any]) -> bool:
        """The tokens controller's work (``controllers.tokens``) on a ``kubernetes.io/service-account-token`` Secret
        whose ServiceAccount exists: a fresh ``data.token``, ``data.namespace``, ``data.ca.crt`` (with TLS) and the
        ServiceAccount's uid annotation, set in ``obj``. Returns False (``obj`` unchanged) for a Secret already holding
        a token or naming no existing ServiceAccount."""
        if obj.get("type") != SERVICE_ACCOUNT_TOKEN_TYPE:
            return False
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        account = self.get_object(self.served("", "v1", "serviceaccounts"), meta.get("namespace"),
                                  str(annotations.get(SERVICE_ACCOUNT_NAME_ANNOTATION) or ""))
        data = obj.get("data") if isinstance(obj.get("data"), dict) else {}
        if account is None or data.get("token"):
            return False
        meta["annotations"] = {**annotations, SERVICE_ACCOUNT_UID_ANNOTATION: account["metadata"]["uid"]}
        token = secrets.token_urlsafe(32)
        self._secret_tokens[token] = (meta["namespace"], meta["name"], account["metadata"]["name"], account["metadata"]["uid"])
        data = {**data, "token": _b64(token), "namespace": _b64(meta["namespace"])}
        if self.ca_pem is not None:
            data["ca.crt"] = _b64(self.ca_pem)
        obj["data"] = data
        return True

    # ----------------------------------------------------------------- authorization

    @staticmethod
    def _attributes(request: kmock.Request) -> Attributes:
        """The authorizer's view of a request (``RequestInfoFactory``)."""
        method = str(request.method.value).upper()
        resource = request.resource
        if resource is None or resource.plural is None:
            return Attributes(verb=method.lower(), resource_request=False, path=request.url.path)
        name = request.name or ""
        if method == "GET":
            verb = "get" if name else ("watch" if truthy(request.params.get("watch")) else "list")
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            verb = _VERBS.get(method, method.lower())
        namespace = request.namespace or ""
        if resource.plural == "namespaces" and (resource.group or "") == "" and name:
            namespace = name  # the apiserver treats /api/v1/namespaces/<name> as a request in that namespace
        # Only the first segment is the subresource: the rest of ``pods/<name>/proxy/<path>`` is the proxied path.
        subresource = (request.subresource or "").split("/")[0]
        return Attributes(verb=verb, api_group=resource.group or "", resource=resource.plural,
                          subresource=subresource, namespace=namespace, name=name, path=request.url.path)

    def _grants(self, user: UserInfo, namespace: str | None) -> list[rbac.Grant]:
        def objects(plural: str) -> list[dict[str, Any]]:
            return self.live_objects(self.served("rbac.authorization.k8s.io", "v1", plural))

        return rbac.grants(user, roles=objects("roles"), cluster_roles=objects("clusterroles"),
                           role_bindings=objects("rolebindings"), cluster_role_bindings=objects("clusterrolebindings"),
                           namespace=namespace)

    def _authorize(self, user: UserInfo, attrs: Attributes) -> None:
        """Raise the apiserver's ``403 Forbidden`` unless RBAC allows the request (the admin is always allowed)."""
        if user.is_admin:
            return
        allowed, _ = rbac.authorize(attrs, self._grants(user, attrs.namespace))
        if not allowed:
            raise ApiError(403, "Forbidden", rbac.forbidden_message(attrs, user), rbac.forbidden_details(attrs))

    def _authorize_apply_create(self, user: UserInfo, attrs: Attributes, request: kmock.Request) -> None:
        """A server-side apply that creates the object also needs ``create`` (Kubernetes docs, "Server-Side Apply",
        RBAC and permissions)."""
        if user.is_admin or attrs.verb != "patch" or attrs.subresource or request.resource is None:
            return
        if not header_value(request.headers, "Content-Type").lower().startswith("application/apply-patch"):
            return
        spec = self._specs.get(request.resource)
        if spec is not None and self.get_object(spec, request.namespace, attrs.name) is None:
            self._authorize(user, dataclasses.replace(attrs, verb="create"))

    def _authorize_rbac_write(self, request: kmock.Request, plural: str, obj: Mapping[str, Any]) -> None:
        """Escalation prevention on a Role, ClusterRole or binding about to be stored (``obj``, the object as it will be):
        its writer must hold every rule it grants, or may ``escalate`` the role / ``bind`` the role referred to; else
        the apiserver's ``403 Forbidden``. The admin, and writes by the emulator's own controllers, are not checked."""
        user = self._request_users.get(id(request))
        if user is None or user.is_admin:
            return
        namespace = request.namespace or ""
        name = str((obj.get("metadata") or {}).get("name") or request.name or "")
        if plural in ("roles", "clusterroles"):
            may = Attributes(verb="escalate", api_group=RBAC_GROUP, resource=plural, namespace=namespace, name=name)
            rules = obj.get("rules") or []
        else:
            ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), Mapping) else {}
            ref_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            ref_name = str(ref.get("name") or "")
            may = Attributes(verb="bind", api_group=RBAC_GROUP, resource=ref_plural, namespace=namespace, name=ref_name)
            role = self.get_object(self.served(RBAC_GROUP, "v1", ref_plural),
                                   namespace if ref_plural == "roles" else None, ref_name)
            rules = (role or {}).get("rules") or []
        found = self._grants(user, namespace)
        if rbac.authorize(may, found)[0]:
            return
        missing = rbac.uncovered_rules(found, rules if isinstance(rules, list) else [])
        if missing:
            raise ApiError(403, "Forbidden", rbac.escalation_message(plural, name, user, missing),
                           {"name": name, "group": RBAC_GROUP, "kind": plural})

    # ----------------------------------------------------------------- identity APIs

    def _identity_api(self, request: kmock.Request, user: UserInfo, attrs: Attributes) -> dict[str, Any] | None:
        """The answer to a self review or a TokenRequest (``201``), or None for any other request."""
        if not attrs.resource_request or attrs.verb != "create":
            return None
        body = request.data if isinstance(request.data, Mapping) else {}
        spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
        if attrs.api_group == AUTHORIZATION_GROUP and attrs.resource == "selfsubjectaccessreviews":
            return self._access_review(user, dict(spec))
        if attrs.api_group == AUTHORIZATION_GROUP and attrs.resource == "selfsubjectrulesreviews":
            namespace = str(spec.get("namespace") or "")
            return {"kind": "SelfSubjectRulesReview", "apiVersion": f"{AUTHORIZATION_GROUP}/v1",
                    "metadata": {"creationTimestamp": None}, "spec": {"namespace": namespace} if namespace else {},
                    "status": rbac.rules_review(self._grants(user, namespace), namespace)}
        if (attrs.api_group, attrs.resource, attrs.subresource) == ("", "serviceaccounts", "token") and attrs.name:
            return self._token_request(attrs.namespace, attrs.name, dict(spec))
        return None

    def _access_review(self, user: UserInfo, spec: dict[str, Any]) -> dict[str, Any]:
        resource = spec.get("resourceAttributes") if isinstance(spec.get("resourceAttributes"), Mapping) else None
        non_resource = spec.get("nonResourceAttributes") if isinstance(spec.get("nonResourceAttributes"), Mapping) else None
        if (resource is None) == (non_resource is None):
            raise ApiError(422, "Invalid", 'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
                           "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be "
                           "specified", None)
        if resource is not None:
            attrs = Attributes(verb=str(resource.get("verb") or ""), api_group=str(resource.get("group") or ""),
                               resource=str(resource.get("resource") or ""),
                               subresource=str(resource.get("subresource") or ""),
                               namespace=str(resource.get("namespace") or ""), name=str(resource.get("name") or ""))
        else:
            assert non_resource is not None
            attrs = Attributes(verb=str(non_resource.get("verb") or ""), resource_request=False,
                               path=str(non_resource.get("path") or ""))
        if user.is_admin:
            allowed, reason = True, ""
        else:
            allowed, reason = rbac.authorize(attrs, self._grants(user, attrs.namespace))
        status: dict[str, Any] = {"allowed": allowed}
        if reason:
            status["reason"] = reason
        return {"kind": "SelfSubjectAccessReview", "apiVersion": f"{AUTHORIZATION_GROUP}/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def _token_request(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        account = self.get_object(self.served("", "v1", "serviceaccounts"), namespace, name)
        if account is None:
            raise ApiError(404, "NotFound", f'serviceaccounts "{name}" not found', {"name": name, "kind": "serviceaccounts"})
        try:
            seconds = int(spec.get("expirationSeconds") or 3600)
        except (TypeError, ValueError):
            seconds = 0
        if seconds < _MIN_TOKEN_SECONDS:
            raise ApiError(422, "Invalid", 'TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: '
                           "Invalid value: may not specify a duration less than 10 minutes", None)
        token = secrets.token_urlsafe(32)
        self._issued_tokens[token] = (namespace, name, account["metadata"]["uid"], time.time() + seconds)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
                "spec": {"audiences": list(spec.get("audiences") or ["https://kubernetes.default.svc"]),
                         "expirationSeconds": seconds, "boundObjectRef": spec.get("boundObjectRef")},
                "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}

    @staticmethod
    def _created(body: dict[str, Any]) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(body, status=201)
