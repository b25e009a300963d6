"""`tableq demo`: the click command for the end-to-end demo (tableq.demo), on --url when one
is given on the command line (never $TABLEQ_URL), else on a fresh SQLite file under --out.
Imports the demo (and with it rich and, unless --no-spark, pyspark) only when the command
runs."""

from __future__ import annotations

import click


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
    report with Spark. Uses --url when given on the command line (not $TABLEQ_URL), else a
    fresh SQLite file under --out; a database that holds messages the demo would purge or
    archive (topic jobs, or any done or dead message) is refused."""
    from tableq import demo as demo_module

    problem = demo_module.out_dir_problem(out)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="'--out'")
    obj = ctx.obj
    # Only a URL given on the command line: $TABLEQ_URL names the queue the user works on,
    # and the demo purges and archives what it runs on.
    argv = [*(["--url", obj.url] if obj.url_source == "COMMANDLINE" else []),
            "--jobs", str(jobs), "--concurrency", str(concurrency), "--out", out,
            *(["--master", master] if master is not None else []),
            *(["--no-spark"] if no_spark else [])]
    demo_module.main(argv)
