"""Celery app and tasks: thin wrappers that call the provisioning and usage services."""
