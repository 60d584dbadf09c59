"""Billing periods: accruals (usage not charged yet) per session and account, period charges, samples' billing period."""

import django.db.models.deletion
from decimal import Decimal
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0006_idle_policy'),
        ('gpu_sessions', '0009_session_reapply_due_at'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Accrual',
            fields=[
                ('session', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='accrual', serialize=False, to='gpu_sessions.session')),
                ('period_start', models.DateTimeField()),
                ('amount', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                ('gpu_seconds', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                ('samples', models.PositiveIntegerField(default=0)),
                ('first_start', models.DateTimeField(blank=True, null=True)),
                ('last_end', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'accrued usage',
                'verbose_name_plural': 'accrued usage',
                'ordering': ['session_id'],
            },
        ),
        migrations.AddField(
            model_name='creditaccount',
            name='accrued',
            field=models.DecimalField(db_default=Decimal('0'), decimal_places=6, default=Decimal('0'), help_text='Usage of open billing periods, not charged yet (held against the balance)', max_digits=18),
        ),
        migrations.AddField(
            model_name='ledgerentry',
            name='period_end',
            field=models.DateTimeField(blank=True, help_text='Charges: the billing period they close (end, UTC)', null=True),
        ),
        migrations.AddField(
            model_name='ledgerentry',
            name='period_start',
            field=models.DateTimeField(blank=True, help_text='Charges: the billing period they close (start, UTC)', null=True),
        ),
        migrations.AddField(
            model_name='ledgerentry',
            name='sample_count',
            field=models.PositiveIntegerField(blank=True, help_text='Charges of a period: the usage samples they cover', null=True),
        ),
        migrations.AddField(
            model_name='usagesample',
            name='billing_period',
            field=models.DateTimeField(blank=True, help_text='Start of the billing period whose charge covers it', null=True),
        ),
        migrations.AddConstraint(
            model_name='creditaccount',
            constraint=models.CheckConstraint(condition=models.Q(('accrued__gte', 0)), name='account_accrued_not_negative'),
        ),
        migrations.AddConstraint(
            model_name='ledgerentry',
            constraint=models.CheckConstraint(condition=models.Q(('period_start__isnull', True), ('period_end__gt', models.F('period_start')), _connector='OR'), name='ledger_period_end_after_start'),
        ),
        migrations.AddConstraint(
            model_name='ledgerentry',
            constraint=models.UniqueConstraint(condition=models.Q(('kind', 'charge'), ('period_start__isnull', False)), fields=('session', 'period_start'), name='ledger_one_charge_per_session_period'),
        ),
        migrations.AddField(
            model_name='accrual',
            name='account',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='accruals', to='billing.creditaccount'),
        ),
        migrations.AddIndex(
            model_name='accrual',
            index=models.Index(fields=['account'], name='accrual_account'),
        ),
        migrations.AddConstraint(
            model_name='accrual',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gte', 0), ('gpu_seconds__gte', 0)), name='accrual_not_negative'),
        ),
        migrations.AddConstraint(
            model_name='accrual',
            constraint=models.CheckConstraint(condition=models.Q(('samples__gt', 0), models.Q(('amount', 0), ('first_start__isnull', True)), _connector='OR'), name='accrual_empty_when_closed'),
        ),
        # Room on each page for ingestion's in-place (HOT) updates of accruals: one row per session, updated every batch.
        migrations.RunSQL("ALTER TABLE billing_accrual SET (fillfactor = 70)", migrations.RunSQL.noop),
    ]
