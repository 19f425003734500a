"""Where the PostgreSQL server's CPU goes during a workload: `perf` across the machine, summarized by phase.

py-spy sees Python processes only, yet about a third of a durable step's CPU on PostgreSQL is the server's
(docs/performance.md). `perf record -a` samples every CPU, the server's backends included; Debian's PostgreSQL is
built without frame pointers, so stacks are unwound from DWARF (`--call-graph dwarf`), which makes a recording
large (about 8 MB a second): keep it to a workload or two. The summary gives, per phase of the server's work, the
share of the samples taken in `postgres` processes whose stack passes through that phase's function
(inclusive, so the phases overlap: the foreign-key checks run inside the statement's execution).

`bench.service_steps` records one extra, untimed round of every PostgreSQL system with it whenever perf can record
here (`--server-profile DIR` keeps the recordings, `--no-server-profile` skips the round). Standalone, around
anything else that runs meanwhile:

    python -m bench._server_profile --seconds 8 --out /tmp/server.data
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = (
    "PHASES",
    "Recording",
    "ServerProfile",
    "available",
    "profile_lines",
    "profile_table",
    "profile_workloads",
    "recordings_dir",
    "summarize",
)

PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("serving a client", ("PostgresMain",)),
    ("statement execution", ("PortalRun",)),
    ("foreign-key checks", ("AfterTriggerEndQuery",)),
    ("CHECK constraints", ("ExecConstraints",)),
    ("PL/pgSQL triggers", ("plpgsql_call_handler",)),
    ("index entries", ("ExecInsertIndexTuples",)),
    ("executor start and end", ("standard_ExecutorStart", "standard_ExecutorEnd")),
    ("commit", ("CommitTransactionCommand",)),
    ("WAL flush", ("XLogFlush",)),
)
"""Each phase and the PostgreSQL functions (inclusive) it is measured by. Serving a client is everything a backend does
for its connection (the rest: other server processes, such as the WAL writer, and stacks perf could not unwind). The
foreign-key checks are the AFTER triggers run at the end of each statement: the only AFTER triggers in candor's
schema and the peers' are the foreign keys' (candor's guard triggers, PL/pgSQL, run BEFORE the row is written).
`ExecConstraints` evaluates a row's CHECK and NOT NULL constraints; PostgreSQL 15 parses every CHECK expression of
the table again at each statement that writes it."""

_LINE = re.compile(r"^\s*(?P<first>[\d.]+)%\s+(?:(?P<second>[\d.]+)%\s+)?(?P<rest>.*?)\s*$")


def available() -> str | None:
    """None when `perf` can record every CPU here, else why not."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed (Debian: linux-perf)"
    probe = subprocess.run(
        [perf, "record", "-e", "cpu-clock", "-a", "-o", "/dev/null", "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        said = probe.stderr.strip().splitlines()
        return f"perf cannot record every CPU: {said[-1] if said else f'exit status {probe.returncode}'}"
    return None


class Recording:
    """`perf record` of every CPU into `path`, from `start` to `stop`."""

    def __init__(self, path: Path, *, frequency: int = 499) -> None:
        self.path = path
        self.frequency = frequency
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        command = ["perf", "record", "-e", "cpu-clock", "-F", str(self.frequency), "-a"]
        command += ["--call-graph", "dwarf,16384", "-o", str(self.path)]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)  # perf maps the CPUs' buffers before it samples

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.send_signal(signal.SIGINT)  # perf writes its file on SIGINT
        self._process.wait(timeout=120)
        self._process = None


@dataclass(frozen=True)
class ServerProfile:
    """What `summarize` read from one recording."""

    machine_share: float
    """Of all samples on every CPU (idle included), the share taken in `postgres` processes."""
    kernel_share: float
    """Of the `postgres` samples, the share in the kernel (sockets, the WAL's write and flush, scheduling)."""
    phases: dict[str, float]
    """Of the `postgres` samples, the share whose stack passes through each phase of `PHASES`."""


def _report(path: Path, *options: str) -> dict[str, float]:
    """`perf report --stdio` as {name: percent of all samples}; a name listed twice (two mappings) is summed."""
    command = ["perf", "report", "-i", str(path), "--stdio", *options]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    shares: dict[str, float] = {}
    for line in output.splitlines():
        match = _LINE.match(line)
        if match is None or line.lstrip().startswith("#"):
            continue
        name = match["rest"].removeprefix("[.] ").removeprefix("[k] ").strip()
        shares[name] = shares.get(name, 0.0) + float(match["first"]) / 100
    return shares


def summarize(path: Path) -> ServerProfile:
    """The server's share of the machine and of its own samples per phase, from a `Recording`'s file."""
    by_command = _report(path, "--no-children", "--sort", "comm")
    server = by_command.get("postgres", 0.0)
    if server == 0.0:
        return ServerProfile(machine_share=0.0, kernel_share=0.0, phases={name: 0.0 for name, _ in PHASES})
    by_object = _report(path, "--no-children", "--sort", "comm,dso", "-g", "none")
    inclusive = _report(path, "--children", "--comm", "postgres", "--sort", "sym", "-g", "none")
    phases = {name: sum(inclusive.get(f, 0.0) for f in functions) / server for name, functions in PHASES}
    return ServerProfile(
        machine_share=server,
        kernel_share=sum(v for k, v in by_object.items() if k.split() == ["postgres", "[kernel.kallsyms]"]) / server,
        phases=phases,
    )


def render(profile: ServerProfile) -> str:
    lines = [
        f"postgres processes: {profile.machine_share:.1%} of all samples (every CPU, idle included); "
        f"of theirs, {profile.kernel_share:.1%} in the kernel"
    ]
    lines += [f"  {name:<24} {share:6.1%}" for name, share in profile.phases.items()]
    return "\n".join(lines)


def recordings_dir(keep: Path | None, off: bool, tmp: Path) -> tuple[Path | None, str | None]:
    """Where recordings go (`keep`, else under `tmp`), or None and why no profile is taken (`off`, no perf)."""
    if off:
        return None, None
    if (missing := available()) is not None:
        return None, missing
    return keep or tmp / "server-profile", None


class Workload(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def total_steps(self) -> int: ...


class System(Protocol):
    @property
    def name(self) -> str: ...

    async def run(self, workload: Any) -> float: ...

    async def settled(self) -> None: ...


async def profile_workloads(
    system: System, workloads: Sequence[Workload], out_dir: Path, server_cpu_ms: Callable[[], float]
) -> list[dict[str, Any]]:
    """Each workload once more under `perf`, untimed. The caller runs this before any figure's baseline is read, so
    no other figure counts these runs. A recording slows every process it samples: the server's CPU per step beside
    the profile (`server_cpu_ms`, read before and after) is this round's, not a measured one's."""
    profiles = []
    for workload in workloads:
        slug = re.sub(r"[^a-z0-9]+", "-", f"{system.name} {workload.name}".lower()).strip("-")
        recording = Recording(out_dir / f"{slug}.data")
        await asyncio.to_thread(recording.start)
        before = server_cpu_ms()
        await system.run(workload)
        server_ms = server_cpu_ms() - before
        await asyncio.to_thread(recording.stop)
        await system.settled()
        found = await asyncio.to_thread(summarize, recording.path)
        profiles.append(
            {
                "system": system.name,
                "workload": workload.name,
                "server_cpu_ms_per_step": server_ms / workload.total_steps,
                "kernel_share": found.kernel_share,
                "phases": found.phases,
                "data": str(recording.path),
            }
        )
    return profiles


def profile_table(profiles: list[dict[str, Any]]) -> list[str]:
    """Per profiled workload, the server's CPU per step and each phase's share of it (inclusive: phases overlap)."""
    if not profiles:
        return []
    names = [name for name, _ in PHASES]
    lines = [
        "",
        "Where the PostgreSQL server's CPU goes (perf, one untimed round; share of the server's samples whose stack "
        "passes through the phase):",
        "",
        "| System | Workload | Server CPU ms per step (profiled) | Kernel | " + " | ".join(names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for p in profiles:
        shares = " | ".join(f"{p['phases'][name]:.0%}" for name in names)
        lines.append(
            f"| {p['system']} | {p['workload']} | {p['server_cpu_ms_per_step']:.2f} | {p['kernel_share']:.0%} "
            f"| {shares} |"
        )
    return lines


def profile_lines(profiles: list[dict[str, Any]], candor: str) -> list[str]:
    """What the profile says of `candor`'s step against each peer's, workload by workload."""
    out = []
    for workload in dict.fromkeys(p["workload"] for p in profiles):
        found = {p["system"]: p for p in profiles if p["workload"] == workload}
        mine = found.get(candor)
        if mine is None:
            continue
        phases = mine["phases"]
        peers = [
            f"{name} {p['server_cpu_ms_per_step']:.2f} ms (commit {p['phases']['commit']:.0%})"
            for name, p in found.items()
            if name != candor
        ]
        out.append(
            f"Server profile, {workload}: candor's step cost PostgreSQL {mine['server_cpu_ms_per_step']:.2f} ms of "
            f"CPU in the profiled round{' (' + ', '.join(peers) + ')' if peers else ''}. Of candor's, "
            f"{phases['statement execution']:.0%} executed statements (mostly the one statement of each boundary "
            f"commit, two per step), within which the foreign-key checks took {phases['foreign-key checks']:.0%}, "
            f"the CHECK constraints {phases['CHECK constraints']:.0%} (PostgreSQL parses each CHECK expression "
            f"again at every statement that writes a table that has them: `runs` has 11, written at claim, start "
            f"and seal), "
            f"the guard triggers {phases['PL/pgSQL triggers']:.0%} and setting up and tearing down the executor "
            f"{phases['executor start and end']:.0%}; the commit (WAL) took {phases['commit']:.0%} and the kernel "
            f"(sockets, the flush, scheduling) {mine['kernel_share']:.0%}."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._server_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to record (default: 8)")
    parser.add_argument("--out", type=Path, default=Path("server-profile.data"), help="perf's data file")
    args = parser.parse_args(argv)
    if (missing := available()) is not None:
        parser.error(missing)
    recording = Recording(args.out)
    recording.start()
    time.sleep(args.seconds)
    recording.stop()
    print(render(summarize(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
