"""Create the sessions app's periodic task (django-celery-beat), so a fresh install has it."""

from django.db import migrations

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds): the outbox relay of session applies and deletes (docs/sessions.md)
    ("sessions: publish due applies and deletes", "sessions.reconcile", 30, 30),
]


class Migration(migrations.Migration):
    dependencies = [
        ("gpu_sessions", "0003_session_stop_requested_at"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [interval_tasks_operation(TASKS)]
