"""The policy's CPU and memory per GPU (defaults and maxima) and its queue limits (priority, queued sessions, timeout)."""


import django.core.validators
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0012_runtime_limit'),
    ]

    operations = [
        migrations.AddField(
            model_name='policy',
            name='default_cpu_per_gpu',
            field=models.DecimalField(decimal_places=2, default=Decimal('4'), help_text='CPU cores per GPU a session gets when its request asks for none', max_digits=6, validators=[django.core.validators.MinValueValidator(Decimal('0'))]),
        ),
        migrations.AddField(
            model_name='policy',
            name='default_memory_gib_per_gpu',
            field=models.DecimalField(decimal_places=2, default=Decimal('16'), help_text='Memory (GiB) per GPU a session gets when its request asks for none', max_digits=8, validators=[django.core.validators.MinValueValidator(Decimal('0'))]),
        ),
        migrations.AddField(
            model_name='policy',
            name='max_cpu_per_gpu',
            field=models.DecimalField(decimal_places=2, default=Decimal('16'), help_text='The most CPU cores per GPU a session may ask for', max_digits=6, validators=[django.core.validators.MinValueValidator(Decimal('0'))]),
        ),
        migrations.AddField(
            model_name='policy',
            name='max_memory_gib_per_gpu',
            field=models.DecimalField(decimal_places=2, default=Decimal('128'), help_text='The most memory (GiB) per GPU a session may ask for', max_digits=8, validators=[django.core.validators.MinValueValidator(Decimal('0'))]),
        ),
        migrations.AddField(
            model_name='policy',
            name='max_queued_sessions',
            field=models.PositiveIntegerField(default=3, help_text='Sessions the user may have waiting in the queue at once (0: none may queue)'),
        ),
        migrations.AddField(
            model_name='policy',
            name='priority',
            field=models.IntegerField(default=0, help_text="Queue order of the user's sessions: higher first, then arrival"),
        ),
        migrations.AddField(
            model_name='policy',
            name='queue_timeout_hours',
            field=models.DecimalField(decimal_places=2, default=Decimal('72'), help_text='Hours a session may wait in the queue before it is dropped', max_digits=7, validators=[django.core.validators.MinValueValidator(Decimal('0'))]),
        ),
    ]
