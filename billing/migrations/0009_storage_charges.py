import billing.models
import django.contrib.postgres.constraints
import django.contrib.postgres.fields.ranges
import django.db.models.deletion
from django.db import migrations, models


def hold_existing_volumes(apps, schema_editor):
    """Volumes that exist already are held, and charged, from now on."""
    from django.utils import timezone

    Volume = apps.get_model("storage", "Volume")
    CreditAccount = apps.get_model("billing", "CreditAccount")
    StorageHolding = apps.get_model("billing", "StorageHolding")
    now = timezone.now()
    for volume in Volume.objects.exclude(status="deleted").order_by("pk"):
        account, _ = CreditAccount.objects.get_or_create(user_id=volume.owner_id)
        StorageHolding.objects.create(volume=volume, account=account, quota_gb=volume.quota_gb, start=now, charged_until=now)


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0008_close_billing_periods_schedule'),
        ('gpu_sessions', '0010_placement_scale'),
        ('storage', '0005_volume_deleting'),
    ]

    operations = [
        migrations.CreateModel(
            name='StorageHolding',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('quota_gb', models.PositiveBigIntegerField()),
                ('start', models.DateTimeField()),
                ('end', models.DateTimeField(blank=True, null=True)),
                ('charged_until', models.DateTimeField()),
            ],
            options={
                'ordering': ['volume_id', 'start'],
            },
        ),
        migrations.AddField(
            model_name='ledgerentry',
            name='volume',
            field=models.CharField(blank=True, db_default='', default='', help_text='Storage charges: the volume whose quota they price (vol_...)', max_length=24),
        ),
        migrations.AddField(
            model_name='policy',
            name='max_volume_gb',
            field=models.PositiveBigIntegerField(blank=True, default=500, help_text="GiB the user's volumes may hold in all (the sum of their quotas; empty: no limit)", null=True),
        ),
        migrations.AlterField(
            model_name='ledgerentry',
            name='kind',
            field=models.CharField(choices=[('grant', 'Grant'), ('charge', 'Charge'), ('refund', 'Refund'), ('adjustment', 'Adjustment'), ('end', 'Session end'), ('storage', 'Storage charge')], max_length=16),
        ),
        migrations.AddConstraint(
            model_name='ledgerentry',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('kind', 'storage'), _negated=True), models.Q(('amount__lte', 0), models.Q(('volume', ''), _negated=True), ('period_start__isnull', False)), _connector='OR'), name='ledger_storage_charge_shape'),
        ),
        migrations.AddConstraint(
            model_name='ledgerentry',
            constraint=models.UniqueConstraint(condition=models.Q(('kind', 'storage')), fields=('volume', 'period_start'), name='ledger_one_storage_charge_per_volume_period'),
        ),
        migrations.AddField(
            model_name='storageholding',
            name='account',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='storage_holdings', to='billing.creditaccount'),
        ),
        migrations.AddField(
            model_name='storageholding',
            name='volume',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='holdings', to='storage.volume'),
        ),
        migrations.AddIndex(
            model_name='storageholding',
            index=models.Index(fields=['charged_until'], name='storage_holding_charged'),
        ),
        migrations.AddConstraint(
            model_name='storageholding',
            constraint=models.CheckConstraint(condition=models.Q(('quota_gb__gte', 1)), name='storage_holding_quota_positive'),
        ),
        migrations.AddConstraint(
            model_name='storageholding',
            constraint=models.CheckConstraint(condition=models.Q(('end__isnull', True), ('end__gt', models.F('start')), _connector='OR'), name='storage_holding_end_after_start'),
        ),
        migrations.AddConstraint(
            model_name='storageholding',
            constraint=models.UniqueConstraint(condition=models.Q(('end__isnull', True)), fields=('volume',), name='storage_holding_one_open'),
        ),
        migrations.AddConstraint(
            model_name='storageholding',
            constraint=django.contrib.postgres.constraints.ExclusionConstraint(expressions=[('volume', '='), (billing.models.TsTzRange('start', 'end', django.contrib.postgres.fields.ranges.RangeBoundary()), '&&')], name='storage_holding_no_overlap'),
        ),
        migrations.RunPython(hold_existing_volumes, migrations.RunPython.noop),
    ]
