"""Stage 3: which variant serves it. The model name (``name`` or ``name:tier``) resolved to a
variant this tenant and key may use, of the right task, with room for the prompt."""

from __future__ import annotations

from dataplane.edge import errors
from dataplane.edge.catalog import Catalog, Variant
from dataplane.edge.echo import model_rewrite
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.validation import EMBEDDING, check_context


def resolve_variant(catalog: Catalog, rec: RequestRecord, kind: str) -> Variant:
    req, tenant, key = rec.req, rec.tenant, rec.key
    assert req is not None and tenant is not None and key is not None
    resolved = catalog.resolve_model(req.model)
    # A model the tenant may not use is answered exactly as one that does not exist.
    if resolved is None or not catalog.usable_pools(tenant.id, resolved[1].id) \
            or not key.allows(resolved[0].name, resolved[1].tier):
        raise errors.model_not_found(req.model)
    variant = resolved[1]
    if (kind == EMBEDDING) != (variant.task == "embed"):
        raise errors.bad_request(
            f"The model '{req.model}' {'does not serve embeddings' if kind == EMBEDDING else 'is an embedding model'}"
            f"; use {'/v1/chat/completions or /v1/completions' if kind == EMBEDDING else '/v1/embeddings'}.",
            param="model", code="model_not_supported")
    rec.variant = variant
    rec.echo = model_rewrite(variant.served_model_name, req.model)
    check_context(req, variant.context_length)
    return variant
