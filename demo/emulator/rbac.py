"""RBAC authorization as the apiserver's RBAC authorizer does it (``plugin/pkg/auth/authorizer/rbac``), evaluated on
every request of an identity other than the admin: Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
(``rbac.authorization.k8s.io/v1``) read from the store, plus the bootstrap policy every authenticated user gets
(``system:basic-user``, ``system:discovery``, ``system:public-info-viewer``: self reviews, discovery, ``/version``,
health).

A rule allows a request when its ``verbs``, ``apiGroups``, ``resources`` (``pods``, ``pods/log``, ``*``, ``*/log``,
``pods/*``) and, for a request naming an object, its ``resourceNames`` (empty: any) all match; a non-resource request
(``/version``) is matched against ``nonResourceURLs`` (a trailing ``*`` is a prefix). ``create`` and collection requests
(``list``, ``watch``, ``deletecollection``) carry no name, so a rule with ``resourceNames`` never allows them.

Not emulated: aggregated ClusterRoles (``aggregationRule``), escalation and bind checks on writes of RBAC objects,
the Node and Webhook authorizers, impersonation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The apiserver's bootstrap ClusterRoles bound to ``system:authenticated`` (``plugin/pkg/auth/authorizer/rbac/
#: bootstrappolicy/policy.go``), reduced to what they grant.
AUTHENTICATED_RULES: tuple[dict[str, Any], ...] = (
    {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
     "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
    {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"]},
    {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                                           "/openapi/*", "/readyz", "/version", "/version/"]},
)
#: cluster-admin's rules: the ``system:masters`` group (the admin kubeconfig's user) is bound to it.
CLUSTER_ADMIN_RULES: tuple[dict[str, Any], ...] = (
    {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
    {"verbs": ["*"], "nonResourceURLs": ["*"]},
)
MASTERS_GROUP = "system:masters"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class UserInfo:
    """An authenticated identity.

    Attributes:
        name: ``kubernetes-admin`` or ``system:serviceaccount:<namespace>:<name>``.
        groups: its groups (``system:masters``; ``system:serviceaccounts``, ``system:serviceaccounts:<namespace>``;
            always ``system:authenticated``).
        uid: the ServiceAccount's uid, or "".
    """

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""

    @property
    def is_admin(self) -> bool:
        """Whether it is in ``system:masters`` (cluster-admin, never checked by RBAC)."""
        return MASTERS_GROUP in self.groups

    @property
    def service_account(self) -> tuple[str, str] | None:
        """``(namespace, name)`` of a ServiceAccount identity, else None."""
        if not self.name.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        namespace, _, name = self.name[len(SERVICE_ACCOUNT_PREFIX):].partition(":")
        return namespace, name


def service_account_user(namespace: str, name: str, uid: str = "") -> UserInfo:
    """The identity of a ServiceAccount's token, with the groups the apiserver gives it."""
    return UserInfo(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
                    ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"), uid)


ADMIN = UserInfo("kubernetes-admin", (MASTERS_GROUP, "system:authenticated"))


@dataclass(frozen=True)
class Attributes:
    """What a request asks for, as the authorizer sees it (``authorizer.AttributesRecord``).

    Attributes:
        verb: ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``, ``deletecollection``
            (resource requests) or the lowercase HTTP method (non-resource requests).
        resource_request: False for ``/version``, ``/api`` ... (then only ``path`` counts).
        api_group: ``""`` for the core group.
        resource: plural, e.g. ``pods``.
        subresource: ``log``, ``status``, ``token`` ... or "".
        namespace: "" for cluster-scoped objects and requests across all namespaces.
        name: "" for collections and create.
        path: the URL path.
    """

    verb: str
    resource_request: bool = True
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


@dataclass
class Grant:
    """The rules one binding gives, and where they come from (for ``reason`` and rules reviews)."""

    rules: list[dict[str, Any]]
    source: str
    namespace: str = ""  # "" : a ClusterRoleBinding (every namespace)
    subjects: list[dict[str, Any]] = field(default_factory=list)


def _contains(values: Iterable[Any] | None, wanted: str) -> bool:
    values = list(values or ())
    return "*" in values or wanted in values


def _resource_matches(resources: Iterable[Any] | None, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for item in resources or ():
        if item == "*" or item == combined:
            return True
        if subresource and (item == f"*/{subresource}" or item == f"{resource}/*"):
            return True
    return False


def _url_matches(urls: Iterable[Any] | None, path: str) -> bool:
    for url in urls or ():
        if url == "*" or url == path or (isinstance(url, str) and url.endswith("*") and path.startswith(url[:-1])):
            return True
    return False


def rule_allows(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    """Whether one PolicyRule allows the request (``rbac.RuleAllows``)."""
    if not _contains(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        return _url_matches(rule.get("nonResourceURLs"), attrs.path)
    if not _contains(rule.get("apiGroups"), attrs.api_group):
        return False
    if not _resource_matches(rule.get("resources"), attrs.resource, attrs.subresource):
        return False
    names = list(rule.get("resourceNames") or ())
    return not names or attrs.name in names


def _subject_matches(subject: Mapping[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        account = user.service_account
        namespace = subject.get("namespace") or binding_namespace
        return account is not None and account == (namespace, subject.get("name"))
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


def grants(user: UserInfo, *, roles: Iterable[Mapping[str, Any]], cluster_roles: Iterable[Mapping[str, Any]],
           role_bindings: Iterable[Mapping[str, Any]], cluster_role_bindings: Iterable[Mapping[str, Any]],
           namespace: str | None) -> list[Grant]:
    """The rules that apply to ``user`` in ``namespace`` (None or "": cluster scope, ClusterRoleBindings only).

    Args:
        roles, cluster_roles, role_bindings, cluster_role_bindings: the stored RBAC objects (dicts).
        namespace: the request's namespace.

    Returns:
        One ``Grant`` per binding naming the user (bootstrap rules and cluster-admin first); a binding whose role does
        not exist grants nothing, as in the apiserver.
    """
    found = [Grant(list(AUTHENTICATED_RULES), 'ClusterRoleBinding "system:basic-user" of ClusterRole '
                   '"system:basic-user" to Group "system:authenticated"')]
    if user.is_admin:
        found.insert(0, Grant(list(CLUSTER_ADMIN_RULES), 'ClusterRoleBinding "cluster-admin" of ClusterRole '
                              '"cluster-admin" to Group "system:masters"'))
        return found
    by_cluster_name = {(r.get("metadata") or {}).get("name"): r for r in cluster_roles}
    by_role = {((r.get("metadata") or {}).get("namespace"), (r.get("metadata") or {}).get("name")): r for r in roles}
    bindings = [(b, "") for b in cluster_role_bindings]
    if namespace:
        bindings += [(b, namespace) for b in role_bindings if (b.get("metadata") or {}).get("namespace") == namespace]
    for binding, binding_namespace in bindings:
        subjects = [s for s in binding.get("subjects") or () if isinstance(s, Mapping)]
        who = next((s for s in subjects if _subject_matches(s, user, binding_namespace)), None)
        if who is None:
            continue
        ref = binding.get("roleRef") or {}
        role = (by_cluster_name.get(ref.get("name")) if ref.get("kind") == "ClusterRole"
                else by_role.get((binding_namespace, ref.get("name"))) if binding_namespace else None)
        if role is None:
            continue
        kind = "RoleBinding" if binding_namespace else "ClusterRoleBinding"
        binding_name = (binding.get("metadata") or {}).get("name")
        where = f'{binding_name}/{binding_namespace}' if binding_namespace else binding_name
        subject = (f'{who.get("kind")} "{who.get("name")}/{who.get("namespace") or binding_namespace}"'
                   if who.get("kind") == "ServiceAccount" else f'{who.get("kind")} "{who.get("name")}"')
        found.append(Grant([dict(r) for r in role.get("rules") or () if isinstance(r, Mapping)],
                           f'{kind} "{where}" of {ref.get("kind")} "{ref.get("name")}" to {subject}', binding_namespace))
    return found


def authorize(attrs: Attributes, found: Iterable[Grant]) -> tuple[bool, str]:
    """``(allowed, reason)``: the first grant with a rule allowing the request, as the RBAC authorizer words it."""
    for grant in found:
        if any(rule_allows(rule, attrs) for rule in grant.rules):
            return True, f"RBAC: allowed by {grant.source}"
    return False, ""


def forbidden_message(attrs: Attributes, user: UserInfo) -> str:
    """The apiserver's 403 message (``responsewriters.forbiddenMessage`` inside ``errors.NewForbidden``), e.g.
    ``nodes is forbidden: User "system:serviceaccount:ns:sa" cannot list resource "nodes" in API group "" at the
    cluster scope``."""
    if not attrs.resource_request:
        return f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    reason = f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" {where}'
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    return f'{qualified} "{attrs.name}" is forbidden: {reason}' if attrs.name else f"{qualified} is forbidden: {reason}"


def forbidden_details(attrs: Attributes) -> dict[str, Any] | None:
    """The 403 Status ``details`` (``name``, ``group``, ``kind``: the resource)."""
    if not attrs.resource_request:
        return None
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.api_group:
        details["group"] = attrs.api_group
    return details


def rules_review(found: Iterable[Grant], namespace: str) -> dict[str, Any]:
    """A ``SelfSubjectRulesReview`` status: the rules of every grant in ``namespace`` (ClusterRoleBindings' too).

    Returns:
        ``{"resourceRules": [{"verbs", "apiGroups", "resources", "resourceNames"?}], "nonResourceRules": [{"verbs",
        "nonResourceURLs"}], "incomplete": False}``.
    """
    resource_rules: list[dict[str, Any]] = []
    non_resource_rules: list[dict[str, Any]] = []
    for grant in found:
        if grant.namespace and grant.namespace != namespace:
            continue
        for rule in grant.rules:
            if rule.get("nonResourceURLs"):
                non_resource_rules.append({"verbs": list(rule.get("verbs") or ()),
                                           "nonResourceURLs": list(rule["nonResourceURLs"])})
            if rule.get("resources"):
                item = {"verbs": list(rule.get("verbs") or ()), "apiGroups": list(rule.get("apiGroups") or ()),
                        "resources": list(rule["resources"])}
                if rule.get("resourceNames"):
                    item["resourceNames"] = list(rule["resourceNames"])
                resource_rules.append(item)
    return {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": False}
