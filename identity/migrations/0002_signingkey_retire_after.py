"""SigningKey.retire_after and SigningKey.imported (signing key rotation); created_at set by the service's clock.

Keys already ``published`` when this runs stopped signing at an unknown moment: they get the safe bound
from now (30 days + the JWT leeway + 5 minutes, as ``identity.keys.signing_key_retire_time``).
"""

from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def set_retire_after(apps, schema_editor):
    SigningKey = apps.get_model("gshare", "SigningKey")
    bound = timedelta(days=30, seconds=settings.GSHARE_JWT_LEEWAY, minutes=5)
    SigningKey.objects.filter(status="published", retire_after__isnull=True).update(retire_after=timezone.now() + bound)


class Migration(migrations.Migration):

    dependencies = [
        ("gshare", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="signingkey",
            name="retire_after",
            field=models.DateTimeField(blank=True, editable=False, help_text="Set when the key stops signing: every token it signed has expired by then (UTC); the key is retired after it", null=True),
        ),
        migrations.AddField(
            model_name="signingkey",
            name="imported",
            field=models.BooleanField(default=False, editable=False, help_text="Imported with manage.py import_signing_key: the scheduled rotation leaves an imported active key alone"),
        ),
        migrations.AlterField(
            model_name="signingkey",
            name="created_at",
            field=models.DateTimeField(default=timezone.now, help_text="When the key was created and started signing (UTC)"),
        ),
        migrations.RunPython(set_retire_after, migrations.RunPython.noop),
    ]
