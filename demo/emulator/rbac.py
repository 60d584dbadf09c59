"""RBAC authorization as the apiserver's RBAC authorizer does it (``plugin/pkg/auth/authorizer/rbac``), evaluated on
every request of an identity other than the admin: Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
(``rbac.authorization.k8s.io/v1``) read from the store, plus the bootstrap policy every authenticated user gets
(``system:basic-user``, ``system:discovery``, ``system:public-info-viewer``: self reviews, discovery, ``/version``,
health).

A rule allows a request when its ``verbs``, ``apiGroups``, ``resources`` (``pods``, ``pods/log``, ``*``, ``*/log``,
``pods/*``) and, for a request naming an object, its ``resourceNames`` (empty: any) all match; a non-resource request
(``/version``) is matched against ``nonResourceURLs`` (a trailing ``*`` is a prefix). ``create`` and collection requests
(``list``, ``watch``, ``deletecollection``) carry no name, so a rule with ``resourceNames`` never allows them.

Writes of Roles, ClusterRoles and their bindings by an identity other than the admin are checked as the apiserver's
escalation prevention does: a Role or ClusterRole may hold only rules its writer holds (unless it may ``escalate``
them), a binding may refer only to a role whose rules its writer holds (unless it may ``bind`` it).

Not emulated: aggregated ClusterRoles (``aggregationRule``), the Node and Webhook authorizers, impersonation.
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
RBAC_GROUP = "rbac.authorization.k8s.io"
#: The kinds whose writes are checked for escalation (``AuthMixin._authorize_rbac_write``).
RBAC_PLURALS = ("roles", "clusterroles", "rolebindings", "clusterrolebindings")
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


def _simple_rules(rule: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    """``rule`` broken into rules of one verb and one group, resource, name or URL (``validation.BreakdownRule``)."""
    verbs = list(rule.get("verbs") or ())
    for url in rule.get("nonResourceURLs") or ():
        for verb in verbs:
            yield {"verbs": [verb], "nonResourceURLs": [url]}
    names = list(rule.get("resourceNames") or ()) or [None]
    for group in rule.get("apiGroups") or ():
        for resource in rule.get("resources") or ():
            for name in names:
                for verb in verbs:
                    simple = {"verbs": [verb], "apiGroups": [group], "resources": [resource]}
                    if name is not None:
                        simple["resourceNames"] = [name]
                    yield simple


def _owner_covers(owner: Mapping[str, Any], simple: Mapping[str, Any]) -> bool:
    """Whether one rule the user holds covers one simple rule (``validation.ruleCovers``): a ``*`` is covered only by
    a ``*``, a rule for every name only by one for every name."""
    if not _contains(owner.get("verbs"), simple["verbs"][0]):
        return False
    if "nonResourceURLs" in simple:
        return _url_matches(owner.get("nonResourceURLs"), simple["nonResourceURLs"][0])
    if not _contains(owner.get("apiGroups"), simple["apiGroups"][0]):
        return False
    resource = simple["resources"][0]
    owned = list(owner.get("resources") or ())
    base, _, sub = resource.partition("/")
    if not ("*" in owned or resource in owned or (sub and (f"{base}/*" in owned or f"*/{sub}" in owned))):
        return False
    owner_names = list(owner.get("resourceNames") or ())
    if not owner_names:
        return True
    return "resourceNames" in simple and simple["resourceNames"][0] in owner_names


def uncovered_rules(found: Iterable[Grant], rules: Iterable[Any]) -> list[dict[str, Any]]:
    """The simple rules of ``rules`` that none of the user's grants cover (``validation.Covers``); empty: all held.

    The apiserver refuses a Role or ClusterRole (without ``escalate``), or a binding to one (without ``bind``), that
    would give rights its writer does not hold: RBAC's escalation prevention."""
    owners = [rule for grant in found for rule in grant.rules]
    missing = []
    for rule in rules:
        if not isinstance(rule, Mapping):
            continue
        missing += [simple for simple in _simple_rules(rule) if not any(_owner_covers(owner, simple) for owner in owners)]
    return missing


def escalation_message(kind_plural: str, name: str, user: UserInfo, missing: list[dict[str, Any]]) -> str:
    """The apiserver's refusal of a write that would grant rights not held (``rbac/validation``)."""
    groups = " ".join(f'"{group}"' for group in user.groups)

    def shown(rule: dict[str, Any]) -> str:
        if "nonResourceURLs" in rule:
            return f'{{NonResourceURLs:["{rule["nonResourceURLs"][0]}"], Verbs:["{rule["verbs"][0]}"]}}'
        names = f', ResourceNames:["{rule["resourceNames"][0]}"]' if "resourceNames" in rule else ""
        return (f'{{APIGroups:["{rule["apiGroups"][0]}"], Resources:["{rule["resources"][0]}"]{names}, '
                f'Verbs:["{rule["verbs"][0]}"]}}')

    return (f'{kind_plural}.rbac.authorization.k8s.io "{name}" is forbidden: user "{user.name}" (groups=[{groups}]) is '
            "attempting to grant RBAC permissions not currently held:\n" + "\n".join(shown(rule) for rule in missing[:20]))
