"""`tableq demo`: runs the end-to-end demo (tableq.demo) from the command line, on the global
--url when one is given, else on a fresh SQLite file under --out. Imports the demo (and with
it rich and, unless --no-spark, pyspark) only when the command runs."""

from __future__ import annotations

from pathlib import Path

import click

# What tableq.demo writes under --out; it empties --out first, so anything else there is not
# ours to delete.
DEMO_OUTPUTS = frozenset({"tableq.db", "tableq.db-wal", "tableq.db-shm", "archive",
                          "report.html"})


def check_out_dir(out: str) -> None:
    """Refuses a directory the demo would wipe (it removes --out before it starts) that holds
    files it did not write, such as '.' or a home directory."""
    path = Path(out)
    if not path.exists():
        return
    if not path.is_dir():
        raise click.BadParameter(f"{out!r} is a file, not a directory", param_hint="'--out'")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in DEMO_OUTPUTS)
    if foreign:
        raise click.BadParameter(
            f"{out!r} holds files the demo did not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}) and the demo empties it first; pick a "
            "new or empty directory", param_hint="'--out'")


@click.command()
@click.option("--jobs", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="How many jobs to load and process.")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="Handler threads of the worker pool.")
@click.option("--master", default=None, metavar="M",
              help="Spark master (default local[*]).")
@click.option("--out", default="demo-out", show_default=True, metavar="DIR",
              help="Directory for the SQLite file, the Parquet archive and the HTML report "
              "(emptied first).")
@click.option("--no-spark", is_flag=True, help="Skip the Spark steps (load with send_many, "
              "no archive or report).")
@click.pass_context
def demo(ctx: click.Context, jobs: int, concurrency: int, master: str | None, out: str,
         no_spark: bool) -> None:
    """Load jobs, process them with a worker pool (retries, dead letters), then archive and
    report with Spark. Uses --url when given, else a fresh SQLite file under --out."""
    check_out_dir(out)
    from tableq import demo as demo_module

    obj = ctx.obj
    argv = [*(["--url", obj.url] if obj.url_given else []),
            "--jobs", str(jobs), "--concurrency", str(concurrency), "--out", out,
            *(["--master", master] if master is not None else []),
            *(["--no-spark"] if no_spark else [])]
    demo_module.main(argv)
