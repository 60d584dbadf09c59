"""WSGI entry point (``gunicorn gshare.wsgi``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gshare.settings")
application = get_wsgi_application()
