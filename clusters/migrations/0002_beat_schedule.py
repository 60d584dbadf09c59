"""Create the clusters app's periodic tasks (django-celery-beat), so a fresh install has them."""

from django.db import migrations

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds)
    ("clusters: mark stale clusters degraded", "clusters.mark_stale", 60, 60),
]


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [interval_tasks_operation(TASKS)]
