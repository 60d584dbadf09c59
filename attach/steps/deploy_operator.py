"""Step 8 of ``attach_cluster``: the operator. The control plane writes the operator's token into the Secret
``gshare-operator-internal-jwt`` itself (``POST /api/v1/clusters/{id}/operator-token/push``: the token never reaches
this machine), then the ``charts/gshare-operator`` release is installed or upgraded."""

from __future__ import annotations

from django.conf import settings

from attach import releases
from attach.api_client import ControlPlaneError
from attach.context import StepContext
from core.exceptions import ApplicationError

TITLE = "operator"


def run(ctx: StepContext) -> str:
    """Have the control plane push the operator token, then install the operator's chart.

    Raises:
        AttachStopped: the push failed (the fix retries it alone), ``--operator-image`` is unusable, or Helm failed.
    """
    cluster = ctx.state.cluster
    assert cluster is not None
    with ctx.kube() as kube:
        ctx.ensure_namespace(kube, releases.operator_namespace())
    retry = (f"retry the token alone: POST {ctx.api_url}/api/v1/clusters/{cluster['id']}/operator-token/push "
             f"(or, where the control plane runs: manage.py rotate_operator_tokens --cluster {cluster['id']})")
    with ctx.control_plane() as api:
        try:
            pushed = api.operator_token_push(cluster["id"])
        except ControlPlaneError as exc:
            raise ctx.stop(f"the control plane could not write the operator token Secret: {exc.detail}"
                           + (f" (code {exc.code})" if exc.code else ""), retry) from None
    try:
        release = releases.operator_release(cluster_id=cluster["id"], control_plane_url=ctx.options.control_plane_url,
                                            image=ctx.options.operator_image,
                                            storage_class=ctx.state.storage.storage_class if ctx.state.storage else "")
    except ApplicationError as exc:
        raise ctx.stop(str(exc), "fix --operator-image") from None
    done = ctx.install(release)
    expires = str(pushed.get("expires_at") or "?").replace("T", " ")[:16] + (" UTC" if pushed.get("expires_at") else "")
    secret = pushed.get("secret") or settings.GSHARE_OPERATOR_TOKEN_SECRET
    return f"ok: {done}; token Secret {secret} {pushed.get('secret_action') or 'written'} by the control plane (expires {expires})"
