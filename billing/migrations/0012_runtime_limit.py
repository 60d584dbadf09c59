"""The policy's session time limit (max_runtime_hours) and the warning before it (runtime_warning_minutes)."""

import django.core.validators
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0011_idle_timeout_help'),
    ]

    operations = [
        migrations.AddField(
            model_name='policy',
            name='max_runtime_hours',
            field=models.DecimalField(decimal_places=2, default=Decimal('24'), help_text='The longest a session may run, in hours from its reservation (its time limit; 0: unlimited)', max_digits=7, validators=[django.core.validators.MinValueValidator(Decimal('0'))]),
        ),
        migrations.AddField(
            model_name='policy',
            name='runtime_warning_minutes',
            field=models.PositiveIntegerField(default=15, help_text="Show the coming stop at a session's time limit this many minutes before it"),
        ),
    ]
