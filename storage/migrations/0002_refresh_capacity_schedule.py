"""Create the storage app's periodic task (django-celery-beat), so a fresh install has it."""

from django.db import migrations

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds)
    ("storage: refresh pool capacity", "storage.refresh_pool_capacity", 60, 60),
]


class Migration(migrations.Migration):
    dependencies = [
        ("storage", "0001_pools_volumes"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [interval_tasks_operation(TASKS)]
