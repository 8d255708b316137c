"""The web console: tenant self-service pages and operator views, server-rendered.

Kept import-light on purpose: the controllers (``controlplane.console.routes``) import the services;
the console's session table lives with the other ORM models (``controlplane.models.console``).
"""
