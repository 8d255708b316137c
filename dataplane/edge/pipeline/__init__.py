"""One inference request's way through the edge, as named stages around one request record.

    authenticate -> validate -> resolve -> cache (exact) -> limit -> cache (semantic)
        -> admit -> route -> relay (stream) -> account

Each stage is a module of its own and reads the edge's shared parts (router, caches, limiter,
meters, and what the stages keep between requests) through ``parts.EdgeParts``, which
``EdgeService`` implements; ``EdgeService._inference`` runs the stages in order.
A stage that refuses a request raises an ``errors.EdgeError``; ``account.finish`` runs once for
every request, whatever happened.
"""
