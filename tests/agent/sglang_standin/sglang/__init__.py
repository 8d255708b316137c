"""Test double standing in for the ``sglang`` package (see ../README.md). Not SGLang."""
