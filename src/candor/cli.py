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
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; exit 1 unless the schema is current.")
    ] = False,
) -> None:
    """Apply pending schema migrations under the migration lock (§10.3)."""
    from .service.store.migrate import check_schema
    from .service.store.migrate import migrate as apply_migrations

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


@app.command()
def serve(
    role: Annotated[str, typer.Option("--role", help="all | control | worker")] = "all",
    config: ConfigOption = None,
) -> None:
    """Run a process: `control` (HTTP API, sweeps), `worker` (executes runs) or `all` (both)."""
    from .service.process import run as run_process

    if role not in ("all", "control", "worker"):
        err.print("[red]candor[/red]: --role must be all, control or worker")
        raise typer.Exit(2)
    settings = load_settings(config)
    try:
        run_process(settings, role)  # type: ignore[arg-type]
    except ServiceError as exc:
        err.print(f"[red]candor: cannot start[/red]: {exc} (code {exc.code})")
        raise typer.Exit(1) from exc


def run_operator(action: Any) -> Any:
    """Run one operator action; service errors become a message on stderr and exit code 1."""
    try:
        return asyncio.run(action)
    except ServiceError as exc:
        err.print(f"[red]candor[/red]: {exc} (code {exc.code})")
        raise typer.Exit(1) from exc


@app.command()
def bootstrap(config: ConfigOption = None) -> None:
    """Create the first workspace and its admin key; print the secret once (refuses if any workspace exists)."""
    from .service import operator

    print_json(run_operator(operator.bootstrap(load_settings(config))))


workspace_app = typer.Typer(help="Manage workspaces (the tenant boundary).", no_args_is_help=True)
key_app = typer.Typer(help="Manage API keys.", no_args_is_help=True)
app.add_typer(workspace_app, name="workspace")
app.add_typer(key_app, name="key")


@workspace_app.command("create")
def workspace_create(name: str, config: ConfigOption = None) -> None:
    """Create a workspace."""
    from .service import operator

    print_json(run_operator(operator.create_workspace(load_settings(config), name)))


@workspace_app.command("archive")
def workspace_archive(workspace_id: str, config: ConfigOption = None) -> None:
    """Archive a workspace: immediate and irreversible; its running runs lose their authority."""
    from .service import operator

    print_json(run_operator(operator.archive_workspace(load_settings(config), workspace_id)))


@workspace_app.command("list")
def workspace_list(config: ConfigOption = None) -> None:
    """List workspaces."""
    from .service import operator

    print_json(run_operator(operator.list_workspaces(load_settings(config))))


@key_app.command("create")
def key_create(
    workspace: Annotated[str, typer.Option("--workspace", help="Workspace id (wsp_…).")],
    permissions: Annotated[str, typer.Option("--permissions", help="Comma-separated: read,run,admin.")] = "read,run",
    name: Annotated[str, typer.Option("--name", help="A label for the key.")] = "key",
    config: ConfigOption = None,
) -> None:
    """Create an API key; the secret is printed once and stored only as a hash."""
    from .service import operator

    wanted = [p.strip() for p in permissions.split(",") if p.strip()]
    print_json(run_operator(operator.create_key(load_settings(config), workspace, wanted, name=name)))


@key_app.command("disable")
def key_disable(key_id: str, config: ConfigOption = None) -> None:
    """Disable an API key: its running runs fail `authority_revoked` at their next heartbeat."""
    from .service import operator

    print_json(run_operator(operator.disable_key(load_settings(config), key_id)))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
