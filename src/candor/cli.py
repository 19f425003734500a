"""The `candor` command: parse arguments, call candor.service, print. No logic of its own.

Every failure is one line on stderr (`candor: …`) and a distinct exit code:

    0  done                         2  invalid settings or arguments (also a bad database URL)
    1  refused (a pending migration  3  the database is unreachable
       for `migrate --check`, an    4  `serve` cannot listen on server.listen (in use, no permission);
       operator action refused)        nothing was started

Results are JSON on stdout; timestamps are RFC 3339 UTC strings, as in the HTTP API.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from .service.errors import ServiceError, SettingsError, StoreUnavailable
from .service.settings import ServiceSettings

T = TypeVar("T")

EXIT_REFUSED = 1
EXIT_INVALID_SETTINGS = 2
EXIT_DATABASE_UNREACHABLE = 3
EXIT_CANNOT_LISTEN = 4
PERMISSIONS = ("read", "run", "admin")

app = typer.Typer(
    help="candor: a durable runtime for LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", metavar="FILE", help="TOML settings file (CANDOR_<SECTION>__<FIELD> variables override it)."
    ),
]


def _version() -> str:
    try:
        return version("candor")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"candor {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """candor: a durable runtime for LLM agents (`candor COMMAND --help` for each command)."""


def fail(message: str, code: int) -> NoReturn:
    """One clean line on stderr and the exit code."""
    typer.echo(f"candor: {message}", err=True)
    raise typer.Exit(code)


def load_settings(config: Path | None) -> ServiceSettings:
    """Settings or one line and exit code 2 (S-124): unknown keys, unsafe combinations and bad database URLs."""
    from .service.store.db import async_url

    try:
        settings = ServiceSettings.load(config)
        settings.check_startup()
        async_url(settings.database.url)
    except SettingsError as exc:
        fail(f"invalid settings: {exc.message}", EXIT_INVALID_SETTINGS)
    except ValueError as exc:  # the database URL: a scheme candor has no driver for, or an in-memory SQLite
        fail(f"invalid settings: database.url: {exc}", EXIT_INVALID_SETTINGS)
    return settings


def is_unreachable(error: BaseException) -> bool:
    """A failure to reach the database at all (refused, unknown host, timeout), as opposed to a refusal."""
    from .service.store.db import is_unavailable

    if isinstance(error, StoreUnavailable) or is_unavailable(error):
        return True
    cause = error.__cause__ or error.__context__
    return cause is not None and cause is not error and is_unreachable(cause)


def run_database(action: Coroutine[Any, Any, T] | Callable[[], T], settings: ServiceSettings) -> T:
    """Run one database action (a coroutine, or a callable that runs its own event loop); a service refusal → exit 1,
    an unreachable database → exit 3 (one line each, naming where the database was looked for)."""
    from .service.store.db import unreachable_message

    try:
        return action() if callable(action) else asyncio.run(action)
    except SettingsError as exc:
        fail(f"invalid settings: {exc.message}", EXIT_INVALID_SETTINGS)
    except Exception as exc:
        if is_unreachable(exc):
            fail(unreachable_message(settings.database.url, exc), EXIT_DATABASE_UNREACHABLE)
        if isinstance(exc, ServiceError):
            fail(f"{exc.message} (code {exc.code})", EXIT_REFUSED)
        raise


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, sort_keys=True))


@app.command()
def migrate(
    config: ConfigOption = None,
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; exit 1 while migrations are pending, 0 when current.")
    ] = False,
) -> None:
    """Apply pending schema migrations under the migration lock."""
    from .service.store.schema import check_schema
    from .service.store.schema import migrate as apply_migrations

    settings = load_settings(config)
    url = settings.database.url
    if check:
        status = run_database(check_schema(url, timeout=settings.database.timeout), settings)
        if status.is_current:
            typer.echo(f"schema is current ({status.head})", err=True)
            return
        current = ", ".join(status.current) or "no schema"
        fail(
            f"schema is not current: database at {current}, build at {status.head} ({len(status.differences)} "
            "difference(s)); run `candor migrate`",
            EXIT_REFUSED,
        )
    applied = run_database(
        apply_migrations(url, lock_timeout=settings.database.migration_lock_timeout, timeout=settings.database.timeout),
        settings,
    )
    typer.echo(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}", err=True)


@app.command()
def serve(
    role: Annotated[str, typer.Option("--role", metavar="ROLE", help="all | control | worker")] = "all",
    config: ConfigOption = None,
) -> None:
    """Run a process: control (HTTP API, sweeps), worker (executes runs) or all (both)."""
    from .service.listen import ListenError, bind_listener
    from .service.logs import configure_logging
    from .service.operator import has_workspace, startup_lines
    from .service.process import run as run_process

    if role not in ("all", "control", "worker"):
        fail("--role must be all, control or worker", EXIT_INVALID_SETTINGS)
    settings = load_settings(config)
    configure_logging(settings.log)

    async def announce(service: Any) -> None:
        exists = await has_workspace(service.engine)
        for line in startup_lines(settings, role, agents=service.agents.names(), workspace_exists=exists):
            typer.echo(line, err=True)

    try:
        listener = bind_listener(settings.server.listen)  # before anything starts: a port in use starts nothing
    except ListenError as exc:
        fail(str(exc), EXIT_CANNOT_LISTEN)
    run_database(lambda: run_process(settings, role, on_prepared=announce, listener=listener), settings)  # type: ignore[arg-type]


@app.command()
def bootstrap(config: ConfigOption = None) -> None:
    """Create the first workspace and its admin key; print the secret once (refuses if any workspace exists)."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.bootstrap(settings), settings))


workspace_app = typer.Typer(
    help="Manage workspaces (the tenant boundary).", no_args_is_help=True, rich_markup_mode=None
)
key_app = typer.Typer(help="Manage API keys.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(workspace_app, name="workspace")
app.add_typer(key_app, name="key")


@workspace_app.command("create")
def workspace_create(
    name: Annotated[str, typer.Argument(help="A label for the workspace.")], config: ConfigOption = None
) -> None:
    """Create a workspace."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.create_workspace(settings, name), settings))


@workspace_app.command("archive")
def workspace_archive(
    workspace_id: Annotated[str, typer.Argument(help="Workspace id (wsp_…).")], config: ConfigOption = None
) -> None:
    """Archive a workspace: immediate and irreversible; its running runs lose their authority."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.archive_workspace(settings, workspace_id), settings))


@workspace_app.command("list")
def workspace_list(config: ConfigOption = None) -> None:
    """List workspaces."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.list_workspaces(settings), settings))


def checked_permissions(text: str) -> list[str]:
    """`read,run` → `["read", "run"]`; at least one, each one of read, run, admin (exit 2 naming the unknown)."""
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in wanted if part not in PERMISSIONS]
    if unknown:
        fail(f"unknown permission {', '.join(map(repr, unknown))}: use read, run or admin", EXIT_INVALID_SETTINGS)
    if not wanted:
        fail("--permissions needs at least one of read, run, admin", EXIT_INVALID_SETTINGS)
    return wanted


@key_app.command("create")
def key_create(
    workspace: Annotated[str, typer.Option("--workspace", metavar="WORKSPACE_ID", help="Workspace id (wsp_…).")],
    permissions: Annotated[
        str, typer.Option("--permissions", metavar="LIST", help="Comma-separated: read, run, admin.")
    ] = "read,run",
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="A label for the key.")] = "key",
    config: ConfigOption = None,
) -> None:
    """Create an API key; the secret is printed once and stored only as a hash."""
    from .service import operator

    wanted = checked_permissions(permissions)
    settings = load_settings(config)
    print_json(run_database(operator.create_key(settings, workspace, wanted, name=name), settings))


@key_app.command("list")
def key_list(
    workspace: Annotated[str, typer.Option("--workspace", metavar="WORKSPACE_ID", help="Workspace id (wsp_…).")],
    config: ConfigOption = None,
) -> None:
    """List a workspace's keys, oldest first (never a secret)."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.list_keys(settings, workspace), settings))


@key_app.command("disable")
def key_disable(key_id: Annotated[str, typer.Argument(help="Key id (key_…).")], config: ConfigOption = None) -> None:
    """Disable an API key: its running runs fail authority_revoked at their next heartbeat."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.disable_key(settings, key_id), settings))


@key_app.command("enable")
def key_enable(key_id: Annotated[str, typer.Argument(help="Key id (key_…).")], config: ConfigOption = None) -> None:
    """Enable a disabled API key again."""
    from .service import operator

    settings = load_settings(config)
    print_json(run_database(operator.enable_key(settings, key_id), settings))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
