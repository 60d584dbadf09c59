"""Periodic tasks as data: a migration operation that creates django-celery-beat interval tasks (and removes them).

Beat schedules are created by migrations so a fresh install has them (docs/architecture.md, "Periodic work"); every app's schedule migration
uses :func:`interval_tasks_operation` instead of its own copy of the same two functions.
"""

from __future__ import annotations

from django.db import migrations


def interval_tasks_operation(tasks: list[tuple[str, str, int, int]]) -> migrations.RunPython:
    """A ``RunPython`` that creates (or updates) interval tasks, and deletes them when unapplied.

    Args:
        tasks: ``(name, task, every seconds, expires seconds)`` per periodic task; ``expires`` no longer than
            ``every`` so a late run is dropped rather than piled up.

    Returns:
        The migration operation (uses the historical ``IntervalSchedule``/``PeriodicTask`` models).
    """

    def create(apps, schema_editor):
        interval_schedule = apps.get_model("django_celery_beat", "IntervalSchedule")
        periodic_task = apps.get_model("django_celery_beat", "PeriodicTask")
        for name, task, every, expires in tasks:
            interval, _ = interval_schedule.objects.get_or_create(every=every, period="seconds")
            periodic_task.objects.update_or_create(
                name=name, defaults={"task": task, "interval": interval, "expire_seconds": expires, "enabled": True}
            )

    def remove(apps, schema_editor):
        periodic_task = apps.get_model("django_celery_beat", "PeriodicTask")
        periodic_task.objects.filter(name__in=[name for name, *_ in tasks]).delete()

    return migrations.RunPython(create, remove)
