"""Create the billing app's overdrawn-stop periodic task (django-celery-beat), so a fresh install has it."""

from django.db import migrations

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds)
    ("billing: stop overdrawn sessions", "billing.stop_overdrawn_sessions", 60, 60),
]


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0001_credits"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [interval_tasks_operation(TASKS)]
