"""`candor.service.signing_keys`: the key ring is a value each service owns (§9.3, §9.4; issue 16)."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from candor.service.signing_keys import NO_KEYS, KeyRing


def _key() -> str:
    return Fernet.generate_key().decode("ascii")


def test_first_key_encrypts_every_key_decrypts() -> None:
    """§9.3: a rotated ring (new key first) still decrypts secrets stored under the old key."""
    old, new = _key(), _key()
    stored = KeyRing.from_keys([old]).encrypt_secret("whsec_1")
    rotated = KeyRing.from_keys([new, old])
    assert rotated.configured and rotated.decrypt_secret(stored) == "whsec_1"
    assert KeyRing.from_keys([new]).decrypt_secret(stored) is None
    assert KeyRing.from_keys([new]).decrypt_secret(rotated.encrypt_secret("whsec_2")) == "whsec_2"


def test_without_keys_nothing_is_encrypted_or_decrypted() -> None:
    """§9.3: no keys → encrypting raises `LookupError`, decrypting gives None; garbage tokens give None (§9.4)."""
    assert KeyRing.from_keys([]) == NO_KEYS and not NO_KEYS.configured
    with pytest.raises(LookupError):
        NO_KEYS.encrypt_secret("whsec")
    assert NO_KEYS.decrypt_secret("anything") is None
    assert KeyRing.from_keys([_key()]).decrypt_secret("not-a-token") is None
    assert KeyRing.from_keys([_key()]).decrypt_secret(None) is None


async def test_each_service_owns_its_ring(tmp_path) -> None:
    """Two services in one process keep their own rings (no process-wide global) and bind them to their engines."""
    from candor.service.core import Service
    from candor.service.settings import ServiceSettings
    from candor.service.store.db.engine import key_ring_of

    keys = [_key()]
    with_keys = await Service.open(
        ServiceSettings(database={"url": f"sqlite:///{tmp_path}/a.db"}, security={"keys": keys})
    )
    without = await Service.open(ServiceSettings(database={"url": f"sqlite:///{tmp_path}/b.db"}))
    try:
        secret = KeyRing.from_keys(keys).encrypt_secret("whsec")
        assert with_keys.key_ring.decrypt_secret(secret) == "whsec"
        assert without.key_ring == NO_KEYS
        async with with_keys.engine.connect() as conn:
            assert key_ring_of(conn) is with_keys.key_ring
        async with without.engine.connect() as conn:
            assert key_ring_of(conn) is NO_KEYS
    finally:
        await with_keys.close()
        await without.close()
