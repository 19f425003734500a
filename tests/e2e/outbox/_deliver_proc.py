"""A control process for the outbox crash test: `python _deliver_proc.py DATABASE_URL RECEIVER_URL`.

Opens a Service with the test key ring (`CANDOR_TEST_KEY`) and runs one `deliver_outbox` pass; the test arms
`outbox_before_settle` through `CANDOR_FAILPOINTS`, so the process dies after the POST and before the settle.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2] / "support")
)  # tests/support: makes `outbox.support` importable

from candor.service.core import Service
from candor.service.outbox.delivery import deliver_outbox

from outbox.support import make_settings


async def main(url: str) -> None:
    service = await Service.open(make_settings(url, keys=(os.environ["CANDOR_TEST_KEY"],)))
    try:
        await deliver_outbox(service)
    finally:
        await service.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
