"""The name rules of Kubernetes objects gShare names itself: the model's fields and the attach command's flags check
the same ones (the attach runs without the database, so the rules live below both)."""

from __future__ import annotations

from django.core.validators import RegexValidator

#: RFC 1123 DNS name (what Kubernetes calls a DNS subdomain): lowercase labels of letters, digits and '-'.
dns_name_validator = RegexValidator(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$",
    message="must be a lowercase DNS name (RFC 1123), e.g. gpu-a.example.com",
    code="invalid_dns_name",
)

#: A cluster name: a DNS label (RFC 1123), as ``POST /api/v1/clusters`` requires.
cluster_name_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    message="must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit, e.g. gpu-a",
    code="invalid_cluster_name",
)
