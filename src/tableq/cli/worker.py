"""`tableq worker MODULE:app`: imports the user's App and runs its handlers, in this process
(threads) or in N supervised child processes (--processes N)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any

import click

from tableq.cli import setup_logging
from tableq.errors import ConfigurationError

CHILD_ENV = "TABLEQ_WORKER_CHILD"
URL_ENV = "TABLEQ_URL"  # what the group's --url reads too


def load_app(spec: str) -> Any:
    """The App named by 'package.module:attribute' (attribute defaults to `app`)."""
    from tableq.worker import App

    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name:
        raise click.BadParameter(f"{spec!r} is not MODULE:app, e.g. myproject.jobs:app")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise click.BadParameter(
                f"cannot import module {module_name!r} (run from the directory that contains "
                "it, or set PYTHONPATH)") from None
        if click.get_current_context().obj.debug:
            raise
        raise click.ClickException(f"importing {module_name!r} failed: {exc}") from None
    except Exception as exc:  # the user's module is broken: say where, briefly
        if click.get_current_context().obj.debug:
            raise
        raise click.ClickException(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc} (rerun with "
            "--debug for the traceback)") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise click.BadParameter(f"module {module_name!r} has no attribute {attr!r}")
    if callable(obj) and not isinstance(obj, App):
        obj = obj()  # a factory function returning the App
    if not isinstance(obj, App):
        raise click.BadParameter(f"{spec} is a {type(obj).__name__}, not a tableq.App")
    return obj


@click.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Threads per topic (overrides each handler's concurrency).")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes, for CPU-bound handlers.")
@click.option("--burst", is_flag=True, help="Drain what is due (and the retries this "
              "worker schedules), then exit.")
@click.option("--prefetch", type=click.IntRange(min=0), default=None,
              help="Messages fetched beyond free threads, per topic (default 0).")
@click.option("--grace-period", type=click.FloatRange(min=0), default=None,
              help="Seconds running handlers get to finish on SIGTERM (default 30).")
@click.option("--api", "api_url", metavar="URL", default=None,
              help="Run against the HTTP API of `tableq serve` at URL instead of the "
              "database (needs --token).")
@click.option("--token", envvar="TABLEQ_TOKEN", default=None, metavar="TOKEN",
              help="Access token for --api (or $TABLEQ_TOKEN, which keeps it out of `ps`).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
              case_sensitive=False), default="INFO", show_default=True)
@click.pass_context
def worker(ctx: click.Context, app_spec: str, topics: tuple[str, ...],
           concurrency: int | None, processes: int, burst: bool, prefetch: int | None,
           grace_period: float | None, api_url: str | None, token: str | None,
           log_level: str) -> None:
    """Run the handlers of the tableq.App at MODULE:APP (e.g. jobs:app). SIGTERM or Ctrl-C
    stops gracefully (running handlers finish, fetched ones are released); a second one
    exits at once. Nothing is lost either way: unacked messages come back after their
    lease."""
    obj = ctx.obj
    setup_logging(obj.debug, log_level)
    app = load_app(app_spec)
    if api_url is not None:
        if not token:
            raise click.UsageError("--api needs --token (or $TABLEQ_TOKEN)")
        if processes > 1:
            raise click.UsageError("--api runs one process; start more workers for more")
        from tableq.client import Client

        app.use_queue(Client(api_url, token))
    elif obj.url_given:
        try:
            app.use_url(obj.url)
        except ConfigurationError:
            if obj.url_source == "COMMANDLINE":
                raise click.UsageError("--url cannot override an App built with queue=; drop "
                                       "--url or build the App from a URL") from None
        else:
            if not app.migrates:  # App(migrate=True) creates its own tables (and file)
                obj.refuse_missing_sqlite_file()
    if processes > 1:
        from tableq.worker import supervisor

        app.check(list(topics) or None)  # one clear error here, not N crash-looping children
        app.close()

        # The URL goes to the children in their environment, never on their command line,
        # where `ps` would show its password to every user of the machine.
        argv = [*(["--debug"] if obj.debug else []),
                "worker", app_spec, "--log-level", log_level,
                *[a for t in topics for a in ("--topic", t)],
                *(["--concurrency", str(concurrency)] if concurrency else []),
                *(["--burst"] if burst else []),
                *(["--prefetch", str(prefetch)] if prefetch is not None else []),
                *(["--grace-period", str(grace_period)] if grace_period is not None else [])]
        env = {**os.environ, CHILD_ENV: "1", supervisor.PARENT_ENV: str(os.getpid()),
               **({URL_ENV: obj.url} if obj.url_given else {})}

        def start(_: int) -> Any:
            # Its own process group: Ctrl-C reaches only us, and we forward one SIGTERM.
            return supervisor.PopenChild(subprocess.Popen(
                supervisor.child_command(argv), env=env, process_group=0))
        code = supervisor.supervise(start, processes, burst=burst)
        ctx.exit(code)
    code = app.run_worker(list(topics) or None, concurrency, burst, prefetch=prefetch,
                          grace_period=grace_period,
                          exit_on_timeout=os.environ.get(CHILD_ENV) == "1")
    app.close()
    ctx.exit(code)
