"""Step 6 of ``attach_cluster``: the control plane's own credential on the cluster, ServiceAccount
``gshare-control-plane`` with exactly the rights the control plane uses (``attach.least_privilege`` holds the rules), made
with the admin kubeconfig; its token's kubeconfig (same server and CA) is what registration sends, never the admin one."""

from __future__ import annotations

from django.conf import settings

from attach import least_privilege, releases
from attach.context import StepContext
from kube.kubeconfig import validate_kubeconfig

TITLE = "control plane credential"


def run(ctx: StepContext) -> str:
    """Apply the ServiceAccount and its RBAC; sets ``state.registered_kubeconfig``.

    Raises:
        AttachStopped: the token Secret gave no token (``least_privilege.CredentialError``).
    """
    namespace = releases.operator_namespace()
    with ctx.kube() as kube:
        ctx.ensure_namespace(kube, namespace)
        try:
            token = least_privilege.apply_credential(kube)
        except least_privilege.CredentialError as exc:
            raise ctx.stop(str(exc), f"kubectl -n {namespace} get secret {least_privilege.TOKEN_SECRET_NAME} -o yaml") from None
    text = least_privilege.credential_kubeconfig(ctx.state.config, token)
    ctx.state.registered_kubeconfig = validate_kubeconfig(text, loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).as_yaml()
    return f"ok: ServiceAccount {namespace}/{least_privilege.ACCOUNT_NAME} (least-privilege RBAC, token Secret {least_privilege.TOKEN_SECRET_NAME})"
