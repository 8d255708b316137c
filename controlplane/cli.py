"""`nimbus` command line: database, API server, admin shortcuts, catalog import."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import httpx

from controlplane.config import get_settings


@click.group()
def main() -> None:
    """Nimbus control plane."""


# ------------------------------------------------------------------ db
@main.group()
def db() -> None:
    """Schema migrations."""


@db.command("upgrade")
@click.option("--revision", default="head")
def db_upgrade(revision: str) -> None:
    from controlplane.db.migrate import upgrade

    upgrade(get_settings().resolved_database_url, revision)
    click.echo(f"database at {revision}")


@db.command("downgrade")
@click.option("--revision", default="base")
def db_downgrade(revision: str) -> None:
    from controlplane.db.migrate import downgrade

    downgrade(get_settings().resolved_database_url, revision)
    click.echo(f"database at {revision}")


# ------------------------------------------------------------------ api
@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8000, type=int)
@click.option("--workers", default=1, type=int)
def api(host: str, port: int, workers: int) -> None:
    """Serve the control plane API (and console)."""
    import uvicorn

    uvicorn.run("controlplane.api.asgi:app", host=host, port=port, workers=workers, log_level="info",
                proxy_headers=True)


# ------------------------------------------------------------------ catalog
@main.group()
def catalog() -> None:
    """Cloud catalog (Terraform's `cloud_catalog` output)."""


@catalog.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def catalog_import(path: Path) -> None:
    from controlplane.db.engine import session_scope
    from controlplane.services import catalog as catalog_service
    from controlplane.services.errors import ServiceError

    doc = json.loads(path.read_text())
    try:
        with session_scope() as session:
            result = catalog_service.import_catalog(session, doc)
    except ServiceError as exc:
        click.echo(f"error: {exc.detail}", err=True)
        for e in exc.errors:
            click.echo(f"  {e.field}: {e.message}", err=True)
        sys.exit(2)
    click.echo(
        f"imported {result.clouds} cloud(s), {result.regions} region(s), {result.zones} zone(s), "
        f"{result.instance_types} instance type(s)"
        + (f"; removed {', '.join(result.removed_regions)}" if result.removed_regions else "")
    )


# ------------------------------------------------------------------ admin shortcuts (over HTTP)
@main.group()
@click.option("--url", envvar="NIMBUS_API_URL", default="http://127.0.0.1:8000", show_default=True)
@click.pass_context
def admin(ctx: click.Context, url: str) -> None:
    """Common admin actions against a running API (uses NIMBUS_ADMIN_TOKEN)."""
    token = get_settings().admin_token.get_secret_value()
    if not token:
        raise click.UsageError("set NIMBUS_ADMIN_TOKEN")
    ctx.obj = httpx.Client(base_url=url.rstrip("/") + "/admin/v1", headers={"Authorization": f"Bearer {token}"},
                           timeout=30)


def _call(client: httpx.Client, method: str, path: str, body: dict | None = None) -> dict:
    resp = client.request(method, path, json=body)
    data = resp.json() if resp.content else {}
    if resp.status_code >= 400:
        click.echo(f"error {resp.status_code}: {data.get('detail', resp.text)}", err=True)
        for e in data.get("errors", []):
            click.echo(f"  {e['field']}: {e['message']}", err=True)
        sys.exit(1)
    return data


@admin.command("create-tenant")
@click.argument("name")
@click.option("--display-name", default="")
@click.option("--email")
@click.pass_obj
def create_tenant(client: httpx.Client, name: str, display_name: str, email: str | None) -> None:
    body = {"name": name, "display_name": display_name}
    if email:
        body["email"] = email
    click.echo(json.dumps(_call(client, "POST", "/tenants", body), indent=2))


@admin.command("list-tenants")
@click.pass_obj
def list_tenants(client: httpx.Client) -> None:
    for t in _call(client, "GET", "/tenants?limit=500")["items"]:
        click.echo(f"{t['id']}  {t['name']:<24} {t['status']}")


@admin.command("create-key")
@click.argument("tenant_id")
@click.option("--name", default="")
@click.option("--scope", "scopes", multiple=True, default=["inference", "manage"])
@click.pass_obj
def create_key(client: httpx.Client, tenant_id: str, name: str, scopes: tuple[str, ...]) -> None:
    data = _call(client, "POST", f"/tenants/{tenant_id}/keys", {"name": name, "scopes": list(scopes)})
    click.echo(f"key {data['key']['prefix']} (shown once): {data['secret']}")


@admin.command("revoke-key")
@click.argument("tenant_id")
@click.argument("key_id")
@click.pass_obj
def revoke_key(client: httpx.Client, tenant_id: str, key_id: str) -> None:
    _call(client, "DELETE", f"/tenants/{tenant_id}/keys/{key_id}")
    click.echo("revoked")


@admin.command("suspend-tenant")
@click.argument("tenant_id")
@click.pass_obj
def suspend_tenant(client: httpx.Client, tenant_id: str) -> None:
    _call(client, "POST", f"/tenants/{tenant_id}/suspend")
    click.echo("suspended")


@admin.command("list-pools")
@click.pass_obj
def list_pools(client: httpx.Client) -> None:
    for p in _call(client, "GET", "/pools?limit=500")["items"]:
        click.echo(f"{p['id']}  {p['name']:<24} {p['model']}:{p['tier']}  desired={p['desired_replicas']} "
                   f"replicas={p['replicas_by_state']}")


if __name__ == "__main__":
    main()
