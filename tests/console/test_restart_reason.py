"""The operator console shows why an engine was last restarted: on the node page per replica, and
in the pool page's replica list. The reason is agent text: escaped, never markup."""

from __future__ import annotations

import datetime as dt
import html
import re

from tests.console.conftest import sign_in_operator
from tests.controlplane.test_restart_reason import HUNG, node_with_replicas, report_restart


def row_of(page: str, table_id: str, replica_id: str) -> str:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S)
    assert table, f"no table {table_id}"
    rows = [r for r in re.findall(r"<tr.*?</tr>", table.group(1), re.S) if replica_id[:8] in r]
    assert len(rows) == 1, rows
    return rows[0]


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)))


async def test_node_and_pool_pages_show_the_restart_reason_escaped(web, api, admin, settings):
    pool, node_id, agent, ids = await node_with_replicas(api, admin, settings)
    at = dt.datetime.now(dt.UTC).replace(hour=12, minute=3, second=7, microsecond=0)
    reason = HUNG + " <script>alert(1)</script>"
    await report_restart(api, agent, ids, reason, at)
    assert (await sign_in_operator(web)).status_code in (302, 303)

    page = (await web.get(f"/console/admin/nodes/{node_id}")).text
    restarted, steady = row_of(page, "node-replicas", ids[0]), row_of(page, "node-replicas", ids[1])
    assert f"restarted 12:03: {reason}" in text_of(restarted) and "(1 restart)" in text_of(restarted)
    assert "restarted" not in text_of(steady)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page

    page = (await web.get(f"/console/admin/pools/{pool.id}")).text
    restarted, steady = row_of(page, "replicas", ids[0]), row_of(page, "replicas", ids[1])
    assert f"restarted 12:03: {reason}" in text_of(restarted)
    assert "restarted" not in text_of(steady)
    assert "<script>alert(1)</script>" not in page
