"""SGLang-compatible engine simulator: same HTTP API and metrics, no GPU, no real tokens.

See ``engine.py`` (scheduler), ``timing.py`` (timing model), ``radix.py`` (prefix cache),
``server.py`` (HTTP), ``process.py`` (a subprocess helper for tests of other packages).
"""
