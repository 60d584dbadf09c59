"""Create the gshare app's periodic tasks (django-celery-beat): signing key rotation and retirement."""

from django.db import migrations

TASKS = [
    # (name, task, crontab (minute, hour, day_of_month), expires seconds)
    ("gshare: rotate the internal JWT signing key (monthly)", "gshare.signing_key_rotate", ("0", "3", "1"), 3600),
    ("gshare: retire signing keys whose tokens have all expired (daily)", "gshare.signing_keys_retire", ("30", "3", "*"), 3600),
]


def create(apps, schema_editor):
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, (minute, hour, day_of_month), expires in TASKS:
        crontab, _ = CrontabSchedule.objects.get_or_create(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year="*", day_of_week="*", timezone="UTC"
        )
        PeriodicTask.objects.update_or_create(
            name=name, defaults={"task": task, "crontab": crontab, "interval": None, "expire_seconds": expires, "enabled": True}
        )


def remove(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[name for name, *_ in TASKS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("gshare", "0002_signingkey_retire_after"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
