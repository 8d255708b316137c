"""The OpenAI-compatible Batch API's worker side: the input file's lines (``jsonl``), the object
store files live in (``storage``) and the runner that sends every line through an edge at batch
priority and writes the output and error files (``runner``). The API-facing side (files and
batches as tenants see them) is ``controlplane.services.batches``."""
