"""`tableq dead list|requeue|purge TOPIC [--id ...]`: the dead-letter store. Queue API only."""

from __future__ import annotations

from typing import Any

import click

from tableq.cli import output
from tableq.cli.queue_cmds import confirm


def _q() -> Any:
    return click.get_current_context().obj.queue()


@click.group()
def dead() -> None:
    """Look at and steer dead letters (messages that ran out of attempts)."""


@dead.command("list")
@click.argument("topic")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_(topic: str, limit: int, as_json: bool) -> None:
    """List TOPIC's dead letters with their last error."""
    rows = _q().dead_letters(topic, limit=limit)
    if as_json:
        output.json_lines([output.dead_dict(d) for d in rows])
        return
    if not rows:
        output.show(f"{output.clean(topic)} has no dead letters")
        return
    output.show(output.dead_table(f"{len(rows)} dead letter(s) of {topic}", rows))


@dead.command()
@click.argument("topic")
@click.option("--id", "ids", type=click.IntRange(min=1), multiple=True,
              help="Only these ids (repeatable); default: all.")
def requeue(topic: str, ids: tuple[int, ...]) -> None:
    """Put dead letters back on TOPIC as fresh messages (attempts reset)."""
    n = _q().requeue_dead(topic, list(ids) if ids else None)
    output.show(f"requeued {n} dead letter(s) on {output.clean(topic)}")
    stayed = len(set(ids)) - n
    if ids and stayed > 0:
        # Said on stderr: nothing failed, but some ids were not there to requeue.
        click.echo(f"{stayed} of the ids given stayed: not dead letters of "
                   f"{output.clean(topic)}, or a live message has the same key (see `tableq "
                   "dead list`)", err=True)


@dead.command("purge")
@click.argument("topic")
@click.option("--id", "ids", type=click.IntRange(min=1), multiple=True,
              help="Only these ids (repeatable); default: all.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def purge_(topic: str, ids: tuple[int, ...], yes: bool) -> None:
    """Delete dead letters of TOPIC for good."""
    if not ids:
        confirm(f"delete every dead letter of {topic!r}", yes)
    n = _q().purge_dead(topic, list(ids) if ids else None)
    output.show(f"purged {n} dead letter(s) of {output.clean(topic)}")
