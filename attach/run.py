"""``attach_cluster``: prepare a GPU cluster, register it and deploy its operator, in ten idempotent steps.

Every step (``attach.steps``, one module each) either finds its work already done (and says so), does it, or stops the
attach with :class:`~attach.context.AttachStopped`, which carries what is wrong and the exact command that fixes it.
Re-running the command is the supported way to repair a half-finished attach or to roll the operator forward. The
cluster is reached only through the kubeconfig given (checked by the same rules as registration); the control plane only
through its public API with a staff token (``attach.api_client``), so the command runs on any machine and never opens
the control plane's database.

Steps (docs/attach.md describes each, its failures and their fixes):

1. reach the cluster (kubeconfig rules, ``/version``): ``steps.reach``;
2. GPU node prerequisites (a check pod per node: driver, container toolkit, containerd's nvidia runtime):
   ``steps.prerequisites``;
3. the ``nvidia`` RuntimeClass and the labels ``gpu=on`` and ``gshare.io/gpu-mode`` on GPU nodes: ``steps.runtime_class``;
4. HAMi, with its kube-scheduler pinned to the cluster's version, then wait for GPUs to be advertised: ``steps.hami``;
5. session routing (``steps.ingress``): Envoy Gateway and the session Gateway (``--routing gateway-api``, the default),
   or ingress-nginx (``--routing ingress-nginx``, retired upstream), on the ingress node; with ``--skip-ingress`` the
   controller the cluster already runs;
6. the control plane's credential: ServiceAccount ``gshare-control-plane`` with least-privilege RBAC and its token
   (``steps.credential``, rules in ``attach.least_privilege``): registration sends that, never the admin kubeconfig;
7. registration through the control plane's API (``POST /api/v1/clusters``, probe included; an existing registration
   is kept and its credential refreshed with ``PATCH``): ``steps.register``;
8. the operator: the control plane pushes its token into the Secret ``gshare-operator-internal-jwt``
   (``POST /api/v1/clusters/{id}/operator-token/push``), then the ``charts/gshare-operator`` release:
   ``steps.deploy_operator``;
9. storage (with ``--storage-values``): NFS client and reachability checks, democratic-csi: ``steps.storage``;
10. the connection test and the operator's first inventory report: ``steps.connection``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ValidationError

from attach.api_client import ControlPlaneError
from attach.context import AttachOptions, AttachStopped, StepContext, control_plane_fix, status_reason
from attach.steps import (
    connection,
    credential,
    deploy_operator,
    hami,
    ingress,
    prerequisites,
    reach,
    register,
    runtime_class,
    storage,
)
from core.exceptions import ApplicationError
from kube import KubeRefused, KubeUnavailable

__all__ = ["STEPS", "Attach", "AttachOptions", "AttachStopped"]

#: The steps in the order they run; each module has ``TITLE`` and ``run(ctx) -> str``.
STEPS = (reach, prerequisites, runtime_class, hami, ingress, credential, register, deploy_operator, storage, connection)
TOTAL_STEPS = len(STEPS)


class Attach(StepContext):
    """One attach: ``run()`` runs the steps and returns the cluster, or raises :class:`AttachStopped`.

    Args:
        options: the flags.
        echo: called with each progress line (``[n/10] what ... result``).
    """

    def run(self) -> dict:
        """Run the ten steps in order.

        Returns:
            The registered cluster as ``GET /api/v1/clusters/{id}`` shows it (connected, first inventory in).

        Raises:
            AttachStopped: a step found a problem it cannot fix; nothing after it ran.
        """
        for number, step in enumerate(STEPS, start=1):
            prefix = f"[{number}/{TOTAL_STEPS}] {step.TITLE}"
            try:
                result = self.guarded(step.run)
            except AttachStopped as stop:
                self.echo(f"{prefix} ... FAILED: {stop.problem}")
                raise
            self.echo(f"{prefix} ... {result}")
        assert self.state.cluster is not None
        return self.state.cluster

    def guarded(self, step: Callable[[StepContext], str]) -> str:
        """Run one step on this attach; every failure becomes an :class:`AttachStopped` with a fix, never a traceback."""
        server = self.state.server or "the apiserver"
        try:
            return step(self)
        except AttachStopped:
            raise
        except ControlPlaneError as exc:
            raise self.stop(f"the control plane at {self.api_url} answered: {exc.detail}"
                            + (f" (HTTP {exc.status}, code {exc.code})" if exc.code else ""),
                            control_plane_fix(exc, self.api_url)) from None
        except (KubeRefused, KubeUnavailable) as exc:
            if not exc.status:
                raise self.stop(f"{server} stopped answering ({exc.cause_name})",
                                f"check it is reachable from the control plane: curl -k --max-time 10 {server}/version") from None
            detail = exc.message or exc.reason
            if exc.status in (401, 403):
                raise self.stop(f"{server} refused a request ({status_reason(exc)}: {detail})",
                                "use a kubeconfig with cluster-admin rights (kubectl auth can-i '*' '*' --all-namespaces); on clusters "
                                "that enforce Pod Security, allow privileged pods in gshare-system: kubectl label namespace "
                                "gshare-system pod-security.kubernetes.io/enforce=privileged --overwrite") from None
            raise self.stop(f"{server} answered {status_reason(exc)}: {detail}",
                            f"check the cluster's state: kubectl get --raw /readyz?verbose (server {server})") from None
        except OSError as exc:
            raise self.stop(f"{server} stopped answering ({type(exc).__name__})",
                            f"check it is reachable from the control plane: curl -k --max-time 10 {server}/version") from None
        except ApplicationError as exc:
            raise self.stop(f"{exc} (code {exc.code})", f"do what the message says (code {exc.code}, docs/errors.md)") from None
        except ValidationError as exc:
            raise self.stop(f"invalid value: {'; '.join(exc.messages)}", "correct the flag and re-run") from None
