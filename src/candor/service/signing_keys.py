"""The process key ring for webhook signing secrets (`security.keys`, §9.3/§9.4): Fernet, first key encrypts, all decrypt.

`configure(keys)` is called once when a `Service` opens; the store reads the ring when it stages a webhook row (a
secret that cannot be decrypted then is staged `dead`, §9.4) and the delivery decrypts the copied secret before
signing. With no keys configured nothing can be encrypted or decrypted.
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

__all__ = ("configure", "configured", "encrypt_secret", "decrypt_secret")

_RING: MultiFernet | None = None


def configure(keys: Iterable[str]) -> None:
    """Install the key ring (`security.keys` values, url-safe base64 Fernet keys); an empty list clears it."""
    global _RING
    values = [key for key in keys]
    _RING = MultiFernet([Fernet(key) for key in values]) if values else None


def configured() -> bool:
    return _RING is not None


def encrypt_secret(secret: str) -> str:
    """Encrypt a signing secret under the first key; raises `LookupError` when no keys are configured."""
    if _RING is None:
        raise LookupError("signing_secret_unavailable")
    return _RING.encrypt(secret.encode("utf-8")).decode("ascii")


def decrypt_secret(token: str | None) -> str | None:
    """The plain secret, or None when there is no ring, no token, or no key decrypts it."""
    if _RING is None or not token:
        return None
    try:
        return _RING.decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, ValueError, UnicodeError):
        return None
