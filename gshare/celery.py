"""The Celery application of the control plane (worker: ``celery -A gshare worker``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gshare.settings")

app = Celery("gshare")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
