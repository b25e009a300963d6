"""The `tableq` command: the root group, global options (--url / $TABLEQ_URL, --debug; --url
is also taken after any subcommand), and the one error boundary that turns failures into one
line on stderr and a non-zero exit (tracebacks only with --debug). Each command group lives in
its own module."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import click

from tableq.errors import TableqError
from tableq.url import DEFAULT_URL

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_state = {"debug": False}


class Context:
    """What every command gets through click's context: the URL and a lazily opened Queue."""

    def __init__(self, url: str, url_source: str | None, debug: bool) -> None:
        self.url, self.url_source, self.debug = url, url_source, debug
        # Given on the command line or in $TABLEQ_URL (not the built-in default).
        self.url_given = url_source in ("COMMANDLINE", "ENVIRONMENT")
        self._queue: Any = None

    def use_url(self, url: str) -> None:
        """A subcommand's own --url: it wins over the group's (and $TABLEQ_URL)."""
        if self._queue is not None:
            raise click.UsageError("--url came too late: the database was already opened")
        self.url, self.url_source, self.url_given = url, "COMMANDLINE", True

    def queue(self, *, migrate: bool = False, create: bool = False, **options: Any) -> Any:
        """The command's Queue, opened once. Only a migrating command (migrate=True, or
        create=True for one that migrates itself) may open a SQLite path that has no file:
        opening creates one, so a mistyped path would become a new, empty queue, and the
        command would then advise migrating it."""
        if self._queue is None:
            import tableq

            if not (migrate or create):
                self.refuse_missing_sqlite_file()
            # The command line registers no codecs: `send --kind K` relays K unvalidated,
            # as `tableq serve` does (a strict queue refused every kind).
            options.setdefault("strict_kinds", False)
            self._queue = tableq.connect(self.url, migrate=migrate, **options)
        return self._queue

    def refuse_missing_sqlite_file(self) -> None:
        from pathlib import Path

        from tableq.errors import SchemaNotMigrated
        from tableq.url import parse_url, redact

        target = parse_url(self.url)
        if target.dialect == "sqlite" and not Path(target.database or "").exists():
            raise SchemaNotMigrated(redact(self.url), no_file=target.database)

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()
            self._queue = None


def setup_logging(debug: bool, level: str | None = None) -> None:
    chosen = logging.DEBUG if debug else getattr(logging, (level or "INFO").upper())
    logging.basicConfig(level=chosen, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger().setLevel(chosen)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--url", envvar="TABLEQ_URL", default=DEFAULT_URL, show_default=True,
              metavar="URL", help="Queue database (or $TABLEQ_URL): sqlite:///file.db, "
              "postgresql://user@host/db, mysql://user@host/db.")
@click.option("--debug", is_flag=True, help="Verbose logs, and tracebacks on errors.")
@click.version_option(package_name="tableq", prog_name="tableq")
@click.pass_context
def cli(ctx: click.Context, url: str, debug: bool) -> None:
    """tableq: a durable message and job queue in an ordinary SQL table."""
    _state["debug"] = debug
    source = ctx.get_parameter_source("url")
    obj = Context(url, source.name if source is not None else None, debug)
    ctx.obj = obj
    ctx.call_on_close(obj.close)
    if debug:
        setup_logging(True)


URL_HELP = ("Queue database for this command (same as `tableq --url`, which it overrides): "
            "sqlite:///file.db, postgresql://user@host/db, mysql://user@host/db.")


def _subcommand_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_root().obj.use_url(value)  # the group's callback made obj before we parse


def accept_url(command: click.Command) -> None:
    """Lets `tableq CMD --url URL` work like `tableq --url URL CMD` (people put options after
    the command, and the README once did too). Commands with their own --url keep it."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            accept_url(sub)
        return
    if any(p.name == "url" for p in command.params):
        return
    command.params.append(click.Option(["--url"], metavar="URL", default=None,
                                       expose_value=False, callback=_subcommand_url,
                                       help=URL_HELP))


def _register() -> None:
    from tableq.cli import dead, demo, doctor, queue_cmds, server_cmds, stats, worker

    for command in (*queue_cmds.COMMANDS, dead.dead, stats.stats, worker.worker, demo.demo,
                    doctor.doctor, *server_cmds.COMMANDS):
        accept_url(command)
        cli.add_command(command)
    _add_pipeline()


def _add_pipeline() -> None:
    """`tableq pipeline` comes from tableq.cli.pipeline when it is there (the Spark part);
    a broken import must not take the rest of the command down."""
    import importlib

    try:
        module = importlib.import_module("tableq.cli.pipeline")
    except ModuleNotFoundError as exc:
        if exc.name in ("tableq.cli.pipeline",):
            return
        _pipeline_stub(exc)
        return
    except Exception as exc:  # noqa: BLE001 - show any failure when the command is used
        _pipeline_stub(exc)
        return
    group = getattr(module, "pipeline", None)
    if isinstance(group, click.Command):
        cli.add_command(group, "pipeline")


def _pipeline_stub(exc: BaseException) -> None:
    @cli.command("pipeline", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def pipeline(args: Any) -> None:
        """Spark pipelines (unavailable: see the error)."""
        raise click.ClickException(f"tableq pipeline is unavailable: {exc}; install "
                                   "'tableq[spark]'")


_register()


def output_line(text: str) -> str:
    """An error for one line of stderr: data in it (topics, keys, server messages) cannot
    move the cursor or recolour the terminal."""
    from tableq.cli.output import one_line

    return one_line(text)


def main(argv: Sequence[str] | None = None) -> None:
    """The console entry point: runs the command and exits with its status."""
    args = list(sys.argv[1:] if argv is None else argv)
    _state["debug"] = "--debug" in args
    try:
        result = cli.main(args=args, prog_name="tableq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        # It may quote the user's data. (click declares `message` Final; shown only here.)
        # A group called with no command says its help, which is ours and keeps its lines.
        if not isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            exc.__dict__["message"] = output_line(exc.message)
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except TableqError as exc:
        if _state["debug"]:
            raise
        click.echo(f"error: {output_line(str(exc))}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as exc:  # a bug, ours or in user code: one line unless --debug
        if _state["debug"]:
            raise
        click.echo(f"error: unexpected {type(exc).__name__}: {output_line(str(exc))} (rerun "
                   "with --debug for the traceback)", err=True)
        sys.exit(EXIT_ERROR)
    sys.exit(result if isinstance(result, int) else 0)


__all__ = ["cli", "main"]
