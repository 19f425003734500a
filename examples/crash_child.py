"""A worker process that dies mid-tool: `python -m examples.crash_child --state S --ledger L --prompt P`.

It runs the support agent through `Harness.stream` and behaves like a careful host: at every `BoundaryEvent` it
exports the state and makes it durable (write a temp file, fsync, `os.replace`) before asking for the next event.
The run waits at each boundary until then (H-36), so the saved file is always a real checkpoint.

With `--crash-after charge_card` (the default) the tool writes its effect to the ledger and the process then
kills itself with SIGKILL: the card was charged, but no result was ever saved. The last file on disk is the state
of the tool boundary, whose `charge_card` call is unanswered. The parent resumes from it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from candor import BoundaryEvent, Harness, HarnessState, RunBindings, RunResultEvent

from .agents import SupportDeps, support_agent


def save_state_atomically(state: HarnessState, path: Path) -> None:
    """Write the checkpoint so a reader sees either the previous file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(state.model_dump_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


async def run_child(state_path: Path, ledger: Path, prompt: str, crash_after: str | None, thread_id: str | None) -> int:
    harness = Harness(support_agent())
    deps = SupportDeps(ledger_path=ledger, crash_after=crash_after)
    previous = HarnessState.new(thread_id) if thread_id else None
    async with harness.stream(prompt, previous_state=previous, bindings=RunBindings(deps=deps)) as stream:
        print(f"child pid={os.getpid()} thread={stream.thread_id} run={stream.run_id}", flush=True)
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                state = await stream.export_state()
                save_state_atomically(state, state_path)
                last = state.message_history[-1].kind if state.message_history else "-"
                print(
                    f"boundary #{event.index} kind={event.kind}: saved {event.message_count} message(s) "
                    f"(last: {last}) to {state_path.name}",
                    flush=True,
                )
            elif isinstance(event, RunResultEvent):
                print(f"run ended: {event.result.status}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True, help="checkpoint file, rewritten at every boundary")
    parser.add_argument("--ledger", type=Path, required=True, help="ledger file the tools append their effects to")
    parser.add_argument("--prompt", default="Please charge order A1 $40 for the replacement part.")
    parser.add_argument("--crash-after", default="charge_card", help="tool after whose effect to SIGKILL ('' = none)")
    parser.add_argument("--thread-id", default=None, help="thread id for the new conversation (default: generated)")
    args = parser.parse_args(argv)
    return asyncio.run(run_child(args.state, args.ledger, args.prompt, args.crash_after or None, args.thread_id))


if __name__ == "__main__":
    sys.exit(main())
