"""Commands on messages: migrate, send (one, or JSON lines in bulk with a progress bar),
receive, peek and purge. They only call the Queue API."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tableq.cli import output
from tableq.errors import LeaseLost, TableqError
from tableq.message import OnDuplicate

INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (tableq.cli's own)
SEND_BATCH = 1000


def _ctx() -> Any:
    return click.get_current_context().obj


@click.command()
def migrate() -> None:
    """Create or upgrade tableq's tables (safe to run again, and from several hosts)."""
    q = _ctx().queue(create=True)
    applied = q.migrate()
    where = output.clean(q.where)
    if applied:
        versions = ", ".join(map(str, applied))
        output.show(f"applied migrations {versions} to {where}")
    else:
        output.show(f"{where} is up to date")


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"{where} is not JSON ({exc.msg} at column {exc.colno}); a string needs quotes, "
            "e.g. '\"hello\"', an object looks like '{\"to\": \"a@b.c\"}'") from None


def _lines(stream: Any) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(stream, start=1):
        if line.strip():
            yield n, _parse_json(line, f"line {n} of stdin")


@click.command()
@click.argument("topic")
@click.argument("payload", required=False)
@click.option("--key", help="Dedup key: at most one live message per topic and key.")
@click.option("--kind", help="Payload kind, carried with the message for its consumers "
              "(the command line has no codecs: it is not validated here).")
@click.option("--delay", type=float, help="Seconds before the message becomes due.")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Higher is delivered first.")
@click.option("--on-duplicate", type=click.Choice(["ignore", "replace", "error"]),
              default="ignore", show_default=True, help="What a duplicate key does.")
def send(topic: str, payload: str | None, key: str | None, kind: str | None,
         delay: float | None, priority: int, on_duplicate: OnDuplicate) -> None:
    """Send PAYLOAD (JSON) to TOPIC. With `-`, or no PAYLOAD and piped input, read one JSON
    value per line from stdin and send them in batches; a line that is an object with a
    "payload" field may also set key, kind, headers, priority, delay."""
    q = _ctx().queue()
    opts = {"kind": kind, "delay": delay, "priority": priority, "on_duplicate": on_duplicate}
    if payload is not None and payload != "-":
        result = q.send(topic, _parse_json(payload, "PAYLOAD"), key=key, **opts)
        # Plain text, no markup: the message is stored, so showing it must not fail.
        output.show(f"{result.status} id={result.id} topic={output.clean(topic)}"
                    + (f" key={output.clean(result.key)}" if result.key else ""))
        return
    if payload is None and sys.stdin.isatty():
        raise click.UsageError("give a PAYLOAD (JSON), or pipe JSON lines and use `-`")
    if key is not None:
        raise click.UsageError("--key applies to one message; in bulk, put \"key\" in each "
                               "line: {\"payload\": ..., \"key\": \"...\"}")
    counts = {"sent": 0, "duplicate": 0, "replaced": 0}
    batch: list[Any] = []

    sending = [0]  # the size of the batch in send_many while it runs

    def flush() -> None:
        if batch:
            sending[0] = len(batch)
            for r in q.send_many(topic, batch, **opts):
                counts[r.status] += 1
            sending[0] = 0
            progress.update(task, advance=len(batch))
            batch.clear()

    progress = Progress(SpinnerColumn(), TextColumn("sending to {task.fields[topic]}",
                                                    markup=False),
                        BarColumn(), TextColumn("{task.completed} messages"),
                        TimeElapsedColumn(), console=output.stderr, transient=True)
    try:
        with progress:
            task = progress.add_task("send", total=None, topic=output.clean(topic))
            for _, item in _lines(sys.stdin):
                batch.append(item)
                if len(batch) >= SEND_BATCH:
                    flush()
            flush()
    except (click.BadParameter, TableqError) as exc:
        done = sum(counts.values())
        text = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise click.ClickException(f"{text} ({done} messages before it were sent; nothing "
                                   "of the failing batch)") from None
    except KeyboardInterrupt:
        # Say what is in the queue, so that the rest can be sent without sending any twice.
        done = sum(counts.values())
        pending = (f"; the batch of {sending[0]} being sent when it came may or may not have "
                   "been (lines with a \"key\" are safe to send again)") if sending[0] else ""
        click.echo(f"Interrupted: the first {done} messages read were sent to "
                   f"{output.clean(topic)}{pending}.", err=True)
        raise click.exceptions.Exit(INTERRUPTED) from None
    total = sum(counts.values())
    output.show(f"sent {total} messages to {output.clean(topic)}: {counts['sent']} new, "
                f"{counts['duplicate']} duplicate, {counts['replaced']} replaced")


@click.command()
@click.argument("topic")
@click.option("--max", "max_", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="How many messages at most.")
@click.option("--ack", is_flag=True, help="Acknowledge (remove) them once they were printed "
              "(if printing fails, nothing is acked); otherwise they stay leased and come back "
              "after the visibility timeout.")
@click.option("--visibility-timeout", type=float, default=None,
              help="Lease length in seconds (default: the queue's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def receive(topic: str, max_: int, ack: bool, visibility_timeout: float | None,
            as_json: bool) -> None:
    """Receive (lease) up to --max due messages from TOPIC and print them."""
    q = _ctx().queue()
    msgs = q.receive(topic, max=max_, visibility_timeout=visibility_timeout)
    # Shown first, acked after: a message is never removed unless its output was written
    # (to a closed pipe, say, it stays leased and comes back after the visibility timeout).
    if as_json:
        output.json_lines([output.message_dict(m) for m in msgs])
    elif not msgs:
        output.show(f"no due messages on {output.clean(topic)}")
    else:
        state = "acking" if ack else "leased"
        output.show(output.messages_table(f"{len(msgs)} message(s) from {topic}, {state}",
                                          msgs, leased=not ack))
    if not (ack and msgs):
        return
    try:
        q.ack_many(msgs)
    except LeaseLost as exc:
        raise click.ClickException(
            f"{exc} (the {len(msgs)} message(s) above were printed; those not named here were "
            "acked)") from None
    if not as_json:
        output.show(f"acked {len(msgs)} message(s)")


@click.command()
@click.argument("topic")
@click.option("--limit", type=click.IntRange(1, 10_000), default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def peek(topic: str, limit: int, as_json: bool) -> None:
    """Show TOPIC's live messages in delivery order, without leasing them."""
    msgs = _ctx().queue().peek(topic, limit)
    if as_json:
        output.json_lines([output.message_dict(m) for m in msgs])
        return
    if not msgs:
        output.show(f"{output.clean(topic)} has no live messages")
        return
    output.show(output.messages_table(f"next {len(msgs)} of {topic}", msgs, leased=False))


def confirm(what: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError(f"refusing to {what} without confirmation; add --yes")
    if not click.confirm(f"{what}?"):  # a "no" is not an interrupt (130): nothing done, 1
        click.echo("Nothing was changed.", err=True)
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("topic")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def purge(topic: str, yes: bool) -> None:
    """Delete every live message of TOPIC (dead letters stay)."""
    confirm(f"delete every live message of {topic!r}", yes)
    n = _ctx().queue().purge(topic)
    output.show(f"purged {n} message(s) from {output.clean(topic)}")


COMMANDS = (migrate, send, receive, peek, purge)
