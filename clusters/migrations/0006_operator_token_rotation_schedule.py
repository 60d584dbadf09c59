"""Create the daily operator token rotation (django-celery-beat), so a fresh install has it."""

from django.db import migrations

NAME = "clusters: rotate operator tokens"
TASK = "clusters.rotate_operator_tokens"
EVERY = 86400  # seconds: daily
EXPIRES = 3600  # a run not started within an hour is dropped (the next day's run catches up)


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    interval, _ = IntervalSchedule.objects.get_or_create(every=EVERY, period="seconds")
    PeriodicTask.objects.update_or_create(
        name=NAME, defaults={"task": TASK, "interval": interval, "expire_seconds": EXPIRES, "enabled": True}
    )


def remove(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0005_cluster_credentials"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
