"""Create the billing app's overdrawn-stop periodic task (django-celery-beat), so a fresh install has it."""

from django.db import migrations

TASKS = [
    # (name, task, every seconds, expires seconds)
    ("billing: stop overdrawn sessions", "billing.stop_overdrawn_sessions", 60, 60),
]


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every, expires in TASKS:
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
        PeriodicTask.objects.update_or_create(
            name=name, defaults={"task": task, "interval": interval, "expire_seconds": expires, "enabled": True}
        )


def remove(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[name for name, *_ in TASKS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0001_credits"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
