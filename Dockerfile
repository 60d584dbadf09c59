# One image for the whole of gShare; both Helm charts run it (default repository ghcr.io/gshare/gshare,
# tag = the charts' appVersion):
#   api (charts/gshare):             gunicorn gshare.wsgi --bind=127.0.0.1:8001, behind nginx -c <ConfigMap> in the same pod
#   worker / beat (charts/gshare):   celery -A gshare worker   |   celery -A gshare beat --scheduler=django_celery_beat.schedulers:DatabaseScheduler
#   migrations (charts/gshare Job):  python manage.py migrate --noinput   (+ import_signing_key --file ...)
#   operator (charts/gshare-operator): python -m operator_agent
# It runs as UID/GID 65532 with a read-only root filesystem; the only writable path is /tmp (an emptyDir in
# the charts), which is also HOME and GSHARE_HOME. charts/ stays in the image: attaching a cluster installs
# charts/gshare-operator from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# nginx: the api pod's proxy container runs it in front of gunicorn (gshare/front_proxy.py, docs/performance.md
# "Slow clients"); its configuration comes from the chart's ConfigMap, every path it writes is under /tmp.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .

# Fail the build, not the pod, when an entry point the charts run cannot be imported; then gather the
# console's static files, served by whitenoise from STATIC_ROOT (/app/staticfiles). Settings need a database
# and a Redis URL to load; neither step connects to them, so throwaway values keep the build from starting
# the embedded servers, and the local state the settings write is removed in the same layer.
RUN export GSHARE_HOME=/tmp/build DATABASE_URL=sqlite:///:memory: REDIS_URL=redis://127.0.0.1:6379/0 \
 && python -c "import operator_agent.main, gshare.wsgi, gshare.celery, gshare.gunicorn_hooks" \
 && python manage.py collectstatic --noinput \
 && rm -rf /tmp/build

ENV HOME=/tmp \
    GSHARE_HOME=/tmp/gshare
USER 65532:65532
EXPOSE 8000
# Without the chart: gunicorn alone, for trying the image; serve it behind nginx (or another buffering proxy) as the
# chart does, or slow clients hold its sync workers (docs/performance.md, "Slow clients").
CMD ["gunicorn", "gshare.wsgi", "--bind=0.0.0.0:8000", "--workers=3", "--config=python:gshare.gunicorn_hooks"]
