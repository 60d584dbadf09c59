"""Create the periodic task that charges billing periods nobody else closed (django-celery-beat), so a fresh install has it."""

from django.db import migrations

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds)
    ("billing: close billing periods", "billing.close_billing_periods", 60, 60),
]


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0007_billing_periods"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [interval_tasks_operation(TASKS)]
