"""The key ring for webhook signing secrets (`security.keys`, §9.3/§9.4): Fernet, first key encrypts, all decrypt.

A `KeyRing` is a value: each `Service` builds its own from its settings (`Service.key_ring`) and hands it down. The
admin actions and the webhook delivery read it off the service; the store, which stages webhook rows inside
transactions (a secret that cannot be decrypted then is staged `dead`, §9.4) and checks secrets on redeliver, reads
it off the connection: the service binds it to its engine (`store.engine.bind_key_ring`). With no keys configured
nothing can be encrypted or decrypted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

__all__ = ("KeyRing", "NO_KEYS")


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The Fernet keys of one service; `NO_KEYS` when `security.keys` is empty."""

    fernet: MultiFernet | None

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> KeyRing:
        """A ring of url-safe base64 Fernet keys (`security.keys` values); no keys → `NO_KEYS`."""
        values = list(keys)
        return cls(MultiFernet([Fernet(key) for key in values])) if values else NO_KEYS

    @property
    def configured(self) -> bool:
        return self.fernet is not None

    def encrypt_secret(self, secret: str) -> str:
        """Encrypt a signing secret under the first key; raises `LookupError` when the ring has no keys."""
        if self.fernet is None:
            raise LookupError("signing_secret_unavailable")
        return self.fernet.encrypt(secret.encode("utf-8")).decode("ascii")

    def decrypt_secret(self, token: str | None) -> str | None:
        """The plain secret, or None when the ring has no keys, there is no token, or no key decrypts it."""
        if self.fernet is None or not token:
            return None
        try:
            return self.fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, ValueError, UnicodeError):
            return None


NO_KEYS = KeyRing(None)
