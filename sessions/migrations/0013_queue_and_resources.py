"""The fleet-wide queue (the Queued phase, order, estimates, the beat entry that admits and expires) and a session's CPU and
memory requests."""


from django.conf import settings
from django.db import migrations, models

from core.beat import interval_tasks_operation

TASKS = [
    # (name, task, every seconds, expires seconds): admit what fits, drop what waited too long, refresh the estimates
    ("sessions: admit queued sessions", "sessions.queue_tick", 30, 30),
]


class Migration(migrations.Migration):

    dependencies = [
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ('clusters', '0016_cluster_clock_offset'),
        ('gpu_sessions', '0012_time_limit'),
        ('storage', '0005_volume_deleting'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='session',
            name='admitted_at',
            field=models.DateTimeField(blank=True, help_text='When the queue admitted it (its GPUs were reserved)', null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='alternatives',
            field=models.JSONField(blank=True, default=list, help_text='Requests that would start sooner (sessions.queue)'),
        ),
        migrations.AddField(
            model_name='session',
            name='cpu',
            field=models.DecimalField(blank=True, decimal_places=3, help_text='CPU cores the pod requests and is limited to (empty: none asked, sessions before CPU requests)', max_digits=7, null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='estimated_start',
            field=models.DateTimeField(blank=True, help_text='When the queue expects to start it (empty: unknown)', null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='first_estimated_start',
            field=models.DateTimeField(blank=True, help_text="The estimate made when it was queued (the estimate's accuracy is measured against it)", null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='memory_gib',
            field=models.DecimalField(blank=True, decimal_places=3, help_text='Memory (GiB) the pod requests and is limited to; /dev/shm is half of it', max_digits=9, null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='priority',
            field=models.IntegerField(default=0, help_text="Queue order: higher first, then arrival (the owner's policy; staff may change it)"),
        ),
        migrations.AddField(
            model_name='session',
            name='queue_expires_at',
            field=models.DateTimeField(blank=True, help_text="When it leaves the queue unstarted (queued_at + the policy's queue_timeout_hours)", null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='queue_position',
            field=models.PositiveIntegerField(blank=True, help_text='1-based place among the queued sessions that could use the same GPUs', null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='queued_at',
            field=models.DateTimeField(blank=True, help_text='When it joined the queue (empty: never queued)', null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='runtime_hours',
            field=models.DecimalField(blank=True, decimal_places=2, help_text="The runtime hours asked (empty: the policy's maximum); a queued session's ends_at counts them from its admission", max_digits=7, null=True),
        ),
        migrations.AddField(
            model_name='session',
            name='waiting_for',
            field=models.TextField(blank=True, default='', help_text='Why it waits, in words'),
        ),
        migrations.AlterField(
            model_name='session',
            name='phase',
            field=models.CharField(choices=[('Queued', 'Queued'), ('Pending', 'Pending'), ('Scheduled', 'Scheduled'), ('Starting', 'Starting'), ('Running', 'Running'), ('Stopping', 'Stopping'), ('Terminated', 'Terminated'), ('Failed', 'Failed')], default='Pending', max_length=16),
        ),
        migrations.AlterField(
            model_name='session',
            name='stop_reason',
            field=models.CharField(blank=True, choices=[('requested', 'on request'), ('credits', 'credits ran out'), ('idle', 'idle policy'), ('time_limit', 'time limit reached'), ('queue_timeout', 'waited in the queue too long')], default='', help_text='Why it was asked to stop (empty while it was not)', max_length=16),
        ),
        migrations.AddIndex(
            model_name='session',
            index=models.Index(condition=models.Q(('phase', 'Queued')), fields=['-priority', 'queued_at', 'id'], name='session_queue_order_idx'),
        ),
        interval_tasks_operation(TASKS),
    ]
