"""ASGI entry point for uvicorn/gunicorn: `uvicorn controlplane.api.asgi:app`."""

from controlplane.api.app import create_app

app = create_app()
