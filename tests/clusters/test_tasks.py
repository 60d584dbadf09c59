"""Beat schedule and the stale-heartbeat task; Celery's broker is the real Redis."""

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from clusters import services, tasks
from clusters.models import Cluster
from gshare.celery import app
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def test_beat_schedule_is_created_by_migration():
    task = PeriodicTask.objects.get(task="clusters.mark_stale")
    assert task.enabled
    assert task.interval.every == 60 and task.interval.period == "seconds"
    assert 0 < task.expire_seconds <= 60  # expires no later than its interval


def test_mark_stale_is_idempotent():
    old = timezone.now() - timedelta(seconds=settings.GSHARE_HEARTBEAT_STALE_SECONDS + 5)
    stale = ClusterFactory(last_heartbeat_at=old)
    fresh = ClusterFactory(last_heartbeat_at=timezone.now())
    assert tasks.clusters_mark_stale.delay().get() == 1
    assert services.clusters_mark_stale() == 0  # a second run changes nothing
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.status == Cluster.Status.DEGRADED
    assert fresh.status == Cluster.Status.CONNECTED


def test_reporting_again_restores_connected():
    cluster = ClusterFactory(status=Cluster.Status.DEGRADED)
    services.inventory_apply(cluster=cluster, nodes=[])
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.CONNECTED


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_tasks_reach_the_real_redis_broker():
    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = "gshare-test-broker"
    client.delete(queue)
    app.send_task("clusters.mark_stale", queue=queue)
    assert client.llen(queue) == 1
    client.delete(queue)
