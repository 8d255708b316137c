#!/bin/sh
# Entrypoint of the one Nimbus image: the first argument picks the role.
set -eu

# Memorystore signs its TLS certificate with a per-instance CA that arrives as an
# environment variable; Redis clients read it from a file (ssl_ca_certs in the URL).
if [ -n "${NIMBUS_REDIS_CA_PEM:-}" ]; then
  printf '%s\n' "$NIMBUS_REDIS_CA_PEM" > "${NIMBUS_REDIS_CA_PATH:-/tmp/redis-ca.pem}"
fi

role="${1:-api}"
[ "$#" -gt 0 ] && shift

# Cloud Run tells the container its port in PORT; elsewhere the NIMBUS_* settings apply.
case "$role" in
  api)
    exec nimbus api --host 0.0.0.0 --port "${PORT:-${NIMBUS_API_PORT:-8000}}" "$@" ;;
  migrate)
    exec nimbus db upgrade "$@" ;;
  # Two queues, two workers that never overlap: `celery` carries the short periodic ticks,
  # `batches` the Batch API runs (controlplane/tasks/app.py TASK_ROUTES), each of which can
  # hold a prefork child for hours. Every batch-worker child runs one batch at a time.
  worker)
    exec celery --app "${NIMBUS_CELERY_APP:-controlplane.tasks.app:app}" worker -Q celery --loglevel INFO "$@" ;;
  batch-worker)
    exec celery --app "${NIMBUS_CELERY_APP:-controlplane.tasks.app:app}" worker -Q batches --loglevel INFO \
      --concurrency "${NIMBUS_BATCH_WORKER_CONCURRENCY:-2}" "$@" ;;
  beat)
    # Exactly one beat runs per deployment; its schedule file is scratch state.
    exec celery --app "${NIMBUS_CELERY_APP:-controlplane.tasks.app:app}" beat --loglevel INFO \
      --schedule /tmp/celerybeat-schedule "$@" ;;
  edge)
    NIMBUS_EDGE_HOST="${NIMBUS_EDGE_HOST:-0.0.0.0}"
    NIMBUS_EDGE_PORT="${PORT:-${NIMBUS_EDGE_PORT:-8080}}"
    export NIMBUS_EDGE_HOST NIMBUS_EDGE_PORT
    exec nimbus-edge "$@" ;;
  agent)
    exec nimbus-agent "$@" ;;
  *)
    echo "nimbus-entrypoint: unknown role '$role' (api, migrate, worker, batch-worker, beat, edge, agent)" >&2
    exit 64 ;;
esac
