"""The `candor` command: parse arguments, call candor.service, print. No logic of its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from .service.errors import ServiceError
from .service.settings import ServiceSettings

app = typer.Typer(help="candor: a durable runtime for LLM agents.", no_args_is_help=True, add_completion=False)
err = Console(stderr=True)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="TOML settings file (env CANDOR_<SECTION>__<FIELD> overrides it).")
]


@app.callback()
def _root() -> None:
    """candor: a durable runtime for LLM agents (`candor COMMAND --help` for each command)."""


def load_settings(config: Path | None) -> ServiceSettings:
    """Settings or a clear message and exit code 2 (S-124): unknown keys and unsafe combinations refuse."""
    try:
        settings = ServiceSettings.load(config)
        settings.check_startup()
    except ServiceError as exc:
        err.print(f"[red]candor: invalid settings[/red]: {exc}")
        raise typer.Exit(2) from exc
    return settings


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, sort_keys=True))


@app.command()
def migrate(
    config: ConfigOption = None,
    check: Annotated[bool, typer.Option("--check", help="Change nothing; exit 1 unless the schema is current.")] = False,
) -> None:
    """Apply pending schema migrations under the migration lock (§10.3)."""
    from .service.store.migrate import check_schema, migrate as apply_migrations

    settings = load_settings(config)
    url = settings.database.url
    if check:
        status = asyncio.run(check_schema(url, timeout=settings.database.timeout))
        if status.is_current:
            err.print(f"schema is current ({status.head})")
            return
        err.print(f"[yellow]schema is not current[/yellow]: database {list(status.current)}, build {status.head}")
        for difference in status.differences:
            err.print(f"  - {difference}")
        raise typer.Exit(1)
    applied = asyncio.run(apply_migrations(url, lock_timeout=settings.database.migration_lock_timeout))
    err.print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
