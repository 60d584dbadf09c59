"""The session time limit: ``ends_at``, the ``time_limit`` stop reason, and the beat entry that enforces it."""

from django.db import migrations, models

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds): stop the sessions past their time limit (sessions.runtime)
    ("sessions: stop sessions at their time limit", "sessions.enforce_runtime", 30, 30),
]


class Migration(migrations.Migration):

    dependencies = [
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ('gpu_sessions', '0011_session_gpu_models'),
    ]

    operations = [
        migrations.AddField(
            model_name='session',
            name='ends_at',
            field=models.DateTimeField(blank=True, help_text='When its time limit stops it (its reservation + its runtime hours, plus extensions; empty: no limit)', null=True),
        ),
        migrations.AlterField(
            model_name='session',
            name='stop_reason',
            field=models.CharField(blank=True, choices=[('requested', 'on request'), ('credits', 'credits ran out'), ('idle', 'idle policy'), ('time_limit', 'time limit reached')], default='', help_text='Why it was asked to stop (empty while it was not)', max_length=16),
        ),
        migrations.AddIndex(
            model_name='session',
            index=models.Index(condition=models.Q(('ends_at__isnull', False), models.Q(('phase__in', ['Terminated', 'Failed']), _negated=True)), fields=['ends_at'], name='session_live_ends_at_idx'),
        ),
        interval_tasks_operation(TASKS),
    ]
