# One image for the control plane (gunicorn, celery worker, celery beat) and the data-plane operator.
#   control plane: docker run IMAGE gunicorn gshare.wsgi --bind 0.0.0.0:8000
#   worker / beat: docker run IMAGE celery -A gshare worker   |   celery -A gshare beat
#   operator:      docker run IMAGE python -m operator_agent   (what charts/gshare-operator runs)
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 GSHARE_HOME=/tmp/gshare
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN python -c "import operator_agent.main"
USER 65532
EXPOSE 8000
CMD ["gunicorn", "gshare.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"]
