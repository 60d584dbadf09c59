"""Public API views for sessions."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters.filters import HELP as CLUSTER_HELP
from core.api.schema import STAFF_ONLY
from sessions import create, idle, lifecycle, runtime, selectors, services
from sessions.api.filters import SessionFilter
from sessions.api.serializers import (
    ExtendSerializer,
    IdleExemptionSerializer,
    PrioritySerializer,
    QueueEntrySerializer,
    SessionCreateSerializer,
    SessionSerializer,
)
from sessions.models import Session
from sessions.queue.priority import queue_priority_set


@extend_schema(parameters=[OpenApiParameter("cluster", str, description=CLUSTER_HELP),
                           OpenApiParameter("phase", str, description=SessionFilter.base_filters["phase"].extra["help_text"])])
@extend_schema_view(list=extend_schema(description="List sessions (``?cluster=``, ``?phase=``)."),
                    retrieve=extend_schema(description="Show one session (node and devices once the operator reported them)."))
class SessionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """``/api/v1/sessions``: start, list, show, stop, connect. Users see their own; staff see all."""

    serializer_class = SessionSerializer
    queryset = Session.objects.none()  # the model, for the schema; get_queryset reads the selector
    filter_backends = [DjangoFilterBackend]
    filterset_class = SessionFilter
    lookup_field = "public_id"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):  # noqa: D102
        return selectors.session_list(user=self.request.user)

    def get_object(self):
        """The session of the URL (404 ``session_not_found``, also for another user's)."""
        return selectors.session_get(user=self.request.user, public_id=self.kwargs["public_id"])

    @extend_schema(
        request=SessionCreateSerializer, responses={201: SessionSerializer, 200: SessionSerializer},
        parameters=[OpenApiParameter(
            "Idempotency-Key", str, location=OpenApiParameter.HEADER, required=False,
            description="Unique per session (e.g. a UUID): a retry with the same key and body returns the first session (200), never a second one",
        )],
    )
    def create(self, request):
        """Start a session: placed now, applied to its cluster in the background. 201, or 200 for a retry of an ``Idempotency-Key``."""
        data = SessionCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = request.headers.get("Idempotency-Key")
        if key is None:
            session, created = create.session_create(owner=request.user, **data.validated_data), True
        else:
            session, created = create.session_create_idempotent(owner=request.user, idempotency_key=key, **data.validated_data)
        session = selectors.session_get(user=request.user, public_id=session.public_id)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def destroy(self, request, public_id: str):
        """Stop a session (202; idempotent)."""
        session = lifecycle.session_stop(session=selectors.session_get(user=request.user, public_id=public_id))
        session = selectors.session_get(user=request.user, public_id=session.public_id)
        return Response(SessionSerializer(session).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"])
    def connect(self, request, public_id: str):
        """A connect link: ``{"url": "https://<domain>/s/<id>/?token=..."}`` (owner or staff)."""
        session = selectors.session_get(user=request.user, public_id=public_id)
        return Response({"url": services.session_connect(session=session, user=request.user)})

    @extend_schema(request=IdleExemptionSerializer, responses={200: SessionSerializer}, extensions={STAFF_ONLY: True})
    @action(detail=True, methods=["post", "delete"], url_path="idle-exemption")
    def idle_exemption(self, request, public_id: str):
        """Staff: exempt the session from the idle policy until ``until`` (POST, with a ``reason``), or end the exemption
        (DELETE). Audited; 403 ``idle_exemption_forbidden`` for anyone else, the owner included."""
        session = selectors.session_get(user=request.user, public_id=public_id)
        if request.method == "DELETE":
            idle.session_idle_exempt(session=session, user=request.user, until=None)
        else:
            data = IdleExemptionSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            idle.session_idle_exempt(session=session, user=request.user, until=data.validated_data["until"],
                                     reason=data.validated_data["reason"])
        return Response(SessionSerializer(selectors.session_get(user=request.user, public_id=public_id)).data)

    @extend_schema(request=ExtendSerializer, responses={200: SessionSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, public_id: str):
        """Move the session's time limit (``ends_at``) ``hours`` later. Staff may extend any session; the owner only within
        their policy's ``max_runtime_hours`` from the reservation (400 ``runtime_over_limit``). Audited."""
        session = selectors.session_get(user=request.user, public_id=public_id)
        data = ExtendSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        runtime.session_extend(session=session, user=request.user, hours=data.validated_data["hours"])
        return Response(SessionSerializer(selectors.session_get(user=request.user, public_id=public_id)).data)

    @extend_schema(request=PrioritySerializer, responses={200: SessionSerializer}, extensions={STAFF_ONLY: True})
    @action(detail=True, methods=["post"])
    def priority(self, request, public_id: str):
        """Staff: set a queued session's priority (higher starts first). Audited; 403 ``priority_forbidden`` for anyone
        else, 409 ``session_not_queued`` once it left the queue."""
        session = selectors.session_get(user=request.user, public_id=public_id)
        data = PrioritySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        queue_priority_set(session=session, user=request.user, priority=data.validated_data["priority"])
        return Response(SessionSerializer(selectors.session_get(user=request.user, public_id=public_id)).data)


@extend_schema(tags=["sessions"],
               description="The fleet's queue in order: every queued session for staff, your own otherwise (with its fleet-wide position).")
class QueueView(generics.ListAPIView):
    """``GET /api/v1/queue``: queued sessions in queue order, with position, estimate, ``waiting_for`` and alternatives."""

    serializer_class = QueueEntrySerializer

    def get_queryset(self):  # noqa: D102
        return selectors.queue_list(user=self.request.user)
