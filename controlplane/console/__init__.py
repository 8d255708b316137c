"""The web console: tenant self-service pages and operator views, server-rendered.

Kept import-light on purpose: ``controlplane.console.models`` is imported by the ORM package,
while the controllers (``controlplane.console.routes``) import the services.
"""
