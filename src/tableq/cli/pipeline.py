"""`tableq pipeline ...`: the Spark pipelines (requeue, archive, report, load) as commands, local
by default (local[*]) and on a cluster with --master or under spark-submit. pyspark is imported
only when a command runs, so `tableq --help` works without it."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import click

from tableq.errors import TableqError

MASTER_HELP = ("Spark master: local[*] by default; e.g. spark://host:7077 or yarn. Under "
               "spark-submit the master it was given is used unless this is set.")


def _url(ctx: click.Context, url: str | None) -> str:
    """The queue's URL: this command's --url, else tableq's (--url, $TABLEQ_URL, the default
    SQLite file). A SQLite path with no file is refused, as by every command but migrate:
    opening it would create an empty queue (and Spark would fail on it with a traceback)."""
    obj = ctx.find_root().obj
    if url:
        obj.use_url(url)
    obj.refuse_missing_sqlite_file()
    return str(obj.url)


# A tableq error raised inside Spark (a task, a data source, foreachBatch) reaches the driver
# wrapped in Spark's exception, with the Python traceback in its text.
_TABLEQ_ERROR = re.compile(r"\btableq(?:\.\w+)*\.([A-Z]\w+): ([^\n]*)")


@contextmanager
def _spark_errors() -> Iterator[None]:
    """Spark's exceptions as one line: the tableq error inside, if there is one."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, (click.ClickException, TableqError)) or \
                not type(exc).__module__.startswith(("pyspark", "py4j")):
            raise
        text = str(exc)
        found = _TABLEQ_ERROR.findall(text)
        if found:
            name, message = found[-1]
            raise click.ClickException(f"{name}: {message}") from exc
        first = next((line.strip() for line in text.splitlines() if line.strip()
                      and not line.lstrip().startswith(("Traceback", "File "))), "")
        first = first.removesuffix("Traceback (most recent call last):").strip()
        raise click.ClickException(f"Spark failed: {type(exc).__name__}: {first} (rerun "
                                   "with --debug for the traceback)") from exc


def _session(master: str | None, app: str) -> Any:
    try:
        from tableq.spark.session import get_session
    except ImportError as exc:
        raise click.ClickException(f"Spark pipelines need pyspark ({exc}); run: "
                                   "pip install 'tableq[spark]'") from None
    return get_session(master, app_name=app)


def common(fn: Any) -> Any:
    fn = click.option("--master", default=None, help=MASTER_HELP)(fn)
    # No envvar here: $TABLEQ_URL reaches the group's --url, so that `tableq --url X pipeline`
    # wins over it, as everywhere else.
    fn = click.option("--url", default=None,
                      help="Queue database URL (default: the tableq --url, or $TABLEQ_URL).")(fn)
    return fn


@click.group("pipeline")
def pipeline() -> None:
    """Spark pipelines over a queue: load, requeue, archive, report."""


@pipeline.command()
@common
@click.argument("path")
@click.option("--topic", required=True, help="Topic to enqueue into.")
@click.option("--format", "fmt", type=click.Choice(["csv", "json", "jsonl", "parquet"]),
              default=None, help="File format (default: from the file extension).")
@click.option("--key", default=None, help="Column holding the message key.")
@click.option("--payload-json", is_flag=True,
              help="A string `payload` column holds JSON text (parse it).")
@click.option("--on-duplicate", type=click.Choice(["ignore", "replace"]), default="ignore")
@click.option("--no-infer-types", "no_infer", is_flag=True,
              help="Keep a CSV's values as text (by default numbers, booleans and times are "
                   "inferred; the --key column is text either way).")
@click.pass_context
def load(ctx: click.Context, url: str | None, master: str | None, path: str, topic: str,
         fmt: str | None, key: str | None, payload_json: bool,
         on_duplicate: Literal["ignore", "replace"], no_infer: bool) -> None:
    """Bulk-enqueue a CSV, JSON-lines or Parquet file, exactly once as a whole. A `payload`
    column is used as the payload (with key, kind, headers, priority, delay_s, available_at
    columns if present); otherwise each row becomes a JSON object payload."""
    url = _url(ctx, url)
    spark = _session(master, "tableq-load")
    from tableq.spark.pipelines.load import load_file

    def show(done: int, total: int) -> None:
        click.echo(f"\rtasks {done}/{total}", nl=False, err=True)

    with _spark_errors():
        r = load_file(spark, url, topic, path, fmt=fmt, key=key, on_duplicate=on_duplicate,
                      payload_format="json" if payload_json else "string", on_progress=show,
                      infer_types=not no_infer)
    click.echo("", err=True)
    rate = r.rows / r.seconds if r.seconds > 0 else 0.0
    click.echo(f"loaded {r.rows:,} rows into {topic!r} in {r.seconds:.1f}s "
               f"({rate:,.0f} rows/s, job {r.job})")


@pipeline.command()
@common
@click.option("--topic", required=True, help="Topic to consume.")
@click.option("--route", required=True,
              help="SQL expression giving each message's new topic, over the columns id, "
                   "key, kind, payload (JSON text), headers, priority, attempts, ...")
@click.option("--order-by", multiple=True, default=("priority DESC", "id"), show_default=True,
              help="Sort within a block (repeatable), e.g. \"get_json_object(payload,'$.at')\".")
@click.option("--block-rows", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--checkpoint", required=True, help="Spark checkpoint directory (keep it: a "
                                                  "rerun continues from it).")
@click.option("--follow", is_flag=True, help="Keep running instead of stopping when drained.")
@click.pass_context
def requeue(ctx: click.Context, url: str | None, master: str | None, topic: str, route: str,
            order_by: tuple[str, ...], block_rows: int, checkpoint: str, follow: bool) -> None:
    """Consume a topic in blocks, route each message by --route, sort, re-enqueue."""
    url = _url(ctx, url)
    spark = _session(master, "tableq-requeue")
    from tableq.spark.pipelines.requeue import requeue as run

    with _spark_errors():
        r = run(spark, url, topic, route=route, order_by=list(order_by),
                block_rows=block_rows, checkpoint=checkpoint, follow=follow)
    click.echo(f"requeued {r.rows:,} messages from {topic!r} in {r.batches} blocks")


@pipeline.command()
@common
@click.option("--out", required=True, help="Archive directory (local, hdfs://, s3a://...).")
@click.option("--older-than", type=click.FloatRange(min=0), default=86400.0, show_default=True,
              help="Archive messages done or dead more than this many seconds ago.")
@click.option("--purge-batch", type=click.IntRange(min=1), default=5000, show_default=True)
@click.pass_context
def archive(ctx: click.Context, url: str | None, master: str | None, out: str,
            older_than: float, purge_batch: int) -> None:
    """Move done and dead messages to Parquet (by topic and date), then purge them. Safe to
    rerun after a crash: an unfinished run is resumed."""
    url = _url(ctx, url)
    spark = _session(master, "tableq-archive")
    from tableq.spark.pipelines.archive import archive as run

    with _spark_errors():
        r = run(spark, url, out, older_than=older_than, purge_batch=purge_batch)
    click.echo(f"archive run {r.run}{' (resumed)' if r.resumed else ''}: cut-off "
               f"{r.cutoff.isoformat(timespec='seconds')}")
    for src in r.written:
        click.echo(f"  {src}: {r.written[src]:,} written to {out}/{src}, "
                   f"{r.purged[src]:,} purged")


@pipeline.command()
@common
@click.option("--html", "html_path", default="tableq-report.html", show_default=True,
              help="Where to write the HTML page with charts ('' for none).")
@click.option("--archive", "archive_path", default=None,
              help="Also include an archive directory written by `pipeline archive`.")
@click.option("--topic", default=None)
@click.option("--bucket", default="1 minute", show_default=True,
              help="Throughput time bucket.")
@click.pass_context
def report(ctx: click.Context, url: str | None, master: str | None, html_path: str,
           archive_path: str | None, topic: str | None, bucket: str) -> None:
    """Per topic: throughput, latency percentiles, attempts, failure and dead-letter rates."""
    url = _url(ctx, url)
    spark = _session(master, "tableq-report")
    from tableq.spark.pipelines.report import report as run

    r = run(spark, url, html_path=html_path or None, archive_path=archive_path, topic=topic,
            bucket=bucket)
    click.echo(r.table() if len(r.summary) else "no finished messages (enable retention= "
                                                "to keep done ones)")
    if r.html_path:
        click.echo(f"wrote {r.html_path}", err=True)


def main() -> None:
    """spark-submit entry: spark-submit src/tableq/cli/pipeline.py archive --out ..."""
    pipeline(standalone_mode=True, args=sys.argv[1:])


if __name__ == "__main__":
    main()
