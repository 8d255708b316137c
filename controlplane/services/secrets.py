"""API key and password material. Keys are high-entropy, so a plain SHA-256 is the right
lookup hash (constant-time equality by digest); passwords are low-entropy, so scrypt."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

KEY_PREFIX = "nmb_"
_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no look-alikes


def new_api_key() -> tuple[str, str, str]:
    """Returns (secret, displayable prefix, sha256 hex). Format: nmb_<8 id chars>_<43 secret chars>."""
    ident = "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))
    secret = f"{KEY_PREFIX}{ident}_{secrets.token_urlsafe(32)}"
    return secret, f"{KEY_PREFIX}{ident}", sha256_hex(secret)


def new_token(nbytes: int = 32) -> tuple[str, str]:
    """A one-time or bearer token and its sha256 (node bootstrap tokens, node credentials)."""
    token = secrets.token_urlsafe(nbytes)
    return token, sha256_hex(token)


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def looks_like_api_key(value: str) -> bool:
    return value.startswith(KEY_PREFIX) and 20 < len(value) < 200


_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    return "scrypt$" + base64.b64encode(salt).decode() + "$" + base64.b64encode(digest).decode()


def verify_password(password: str, stored: str | None) -> bool:
    if not stored or not stored.startswith("scrypt$"):
        return False
    _, salt_b64, digest_b64 = stored.split("$", 2)
    digest = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt_b64), dklen=32, **_SCRYPT)
    return hmac.compare_digest(digest, base64.b64decode(digest_b64))
