"""Spark benchmark (a program, not a test): bulk enqueue into PostgreSQL through the tableq
writer vs Spark's own JDBC writer into the same kind of table (tableq's message table, same
indexes, in a second schema), in the same run; then streaming consume throughput.

    .venv/bin/python benchmarks/spark_bench.py --rows 1000000 --stream-rows 200000

Needs Debian's pgJDBC jar for the comparison: apt-get install -y libpostgresql-jdbc-java."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import tableq
import tableq.url
from tableq.spark.session import get_session

JAR = "/usr/share/java/postgresql.jar"


def _fresh(base: str, tag: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema=bench_{tag}_{uuid.uuid4().hex[:8]}"


def _jdbc_url(url: str) -> tuple[str, str, str]:
    u = tableq.url.parse_url(url)
    jdbc = (f"jdbc:postgresql://{u.host}:{u.port or 5432}/{u.database}"
            "?reWriteBatchedInserts=true&stringtype=unspecified")
    return jdbc, u.user or "postgres", u.password or ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get(
        "TABLEQ_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--stream-rows", type=int, default=200_000)
    ap.add_argument("--max-rows", type=int, default=50_000, help="stream micro-batch size")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="batch write rounds (medians)")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    conf = {"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "2"}
    have_jar = os.path.exists(JAR)
    if have_jar:
        conf["spark.jars"] = JAR
    spark = get_session(args.master, app_name="tableq-spark-bench", conf=conf)
    from pyspark.sql import functions as F

    n, parts = args.rows, args.partitions
    results: list[tuple[str, int, float]] = []

    def frame(rows: int):  # type: ignore[no-untyped-def]
        return spark.range(0, rows, 1, parts).select(
            F.struct(F.col("id").alias("n"),
                     F.concat(F.lit("payload-"), F.col("id").cast("string")).alias("s"))
            .alias("payload"))

    # Warm-up: JVM, Python workers, planner processes.
    warm = _fresh(args.url, "warm")
    tableq.connect(warm, migrate=True).close()
    frame(1000).write.format("tableq").option("url", warm).option("topic", "w") \
        .mode("append").save()

    def tableq_write(url: str) -> float:
        q = tableq.connect(url, migrate=True)
        t = time.perf_counter()
        frame(n).write.format("tableq").option("url", url).option("topic", "bench") \
            .mode("append").save()
        took = time.perf_counter() - t
        assert q.stats("bench")[0].ready == n, q.stats("bench")
        q.close()
        return took

    def jdbc_write(url: str) -> float:
        q = tableq.connect(url, migrate=True)  # the same table, indexes and trigger
        schema = tableq.url.parse_url(url).namespace
        jdbc, user, password = _jdbc_url(args.url)
        df = frame(n).select(
            F.lit("bench").alias("topic"), F.to_json("payload").alias("payload"),
            F.current_timestamp().alias("available_at"),
            F.current_timestamp().alias("first_available_at"))
        t = time.perf_counter()
        (df.write.format("jdbc").option("url", jdbc).option("driver", "org.postgresql.Driver")
         .option("dbtable", f"{schema}.message").option("user", user)
         .option("password", password).option("batchsize", "10000").mode("append").save())
        took = time.perf_counter() - t
        assert q.stats("bench")[0].ready == n, q.stats("bench")
        q.close()
        return took

    # Rounds alternate which writer goes first; each writes into a fresh schema.
    schemas = [warm]
    times: dict[str, list[float]] = {"tableq": [], "jdbc": []}
    writers = {"tableq": tableq_write, "jdbc": jdbc_write}
    if not have_jar:
        print(f"(no {JAR}: JDBC comparison skipped)", file=sys.stderr)
        del writers["jdbc"]
    for r in range(args.rounds):
        order = list(writers) if r % 2 == 0 else list(reversed(writers))
        for name in order:
            url = _fresh(args.url, name)
            schemas.append(url)
            times[name].append(writers[name](url))
            if name == "tableq":
                tq_url = url  # the streams below reuse this schema
            print(f"round {r + 1}: {name} {times[name][-1]:.1f} s", file=sys.stderr)
    q = tableq.connect(tq_url)
    results.append(("batch write: tableq writer (COPY, exactly once; median of "
                    f"{args.rounds})", n, statistics.median(times["tableq"])))
    if times["jdbc"]:
        results.append(("batch write: Spark JDBC writer into the same table (per-task "
                        f"commits, not exactly once; median of {args.rounds})", n,
                        statistics.median(times["jdbc"])))

    m = args.stream_rows
    ck = tempfile.mkdtemp(prefix="tableq-bench-ck-")
    try:
        # Consume: an AvailableNow query drains a topic of m messages into a noop sink.
        for topic in ("stream-a", "stream-b"):
            frame(m).write.format("tableq").option("url", tq_url).option("topic", topic) \
                .mode("append").save()
        t = time.perf_counter()
        (spark.readStream.format("tableq").option("url", tq_url).option("topic", "stream-a")
         .option("maxRows", str(args.max_rows)).load()
         .writeStream.format("noop").option("checkpointLocation", f"{ck}/a")
         .trigger(availableNow=True).start().awaitTermination())
        took = time.perf_counter() - t
        assert not q.stats("stream-a") or q.stats("stream-a")[0].live == 0
        results.append((f"stream read (maxRows={args.max_rows}) -> noop, acked", m, took))
        # Topic to topic, exactly once: stream-b -> moved through the tableq sink.
        t = time.perf_counter()
        (spark.readStream.format("tableq").option("url", tq_url).option("topic", "stream-b")
         .option("maxRows", str(args.max_rows)).load()
         .select("payload").writeStream.format("tableq").option("url", tq_url)
         .option("topic", "moved").option("payloadFormat", "json")
         .option("sinkName", "bench").option("checkpointLocation", f"{ck}/b")
         .trigger(availableNow=True).start().awaitTermination())
        took = time.perf_counter() - t
        moved = q.stats("moved")[0].ready
        assert moved == m, (moved, m)
        results.append((f"stream a -> b through the tableq sink (maxRows={args.max_rows})",
                        moved, took))
    finally:
        shutil.rmtree(ck, ignore_errors=True)
    q.close()
    _drop_schemas(args.url, schemas)
    print(f"\nPostgreSQL, {args.master}, {parts} partitions, pyspark {spark.version}\n")
    print("| path | rows | seconds | rows/s |")
    print("|---|---:|---:|---:|")
    for name, rows, secs in results:
        print(f"| {name} | {rows:,} | {secs:.1f} | {rows / secs:,.0f} |")
    if times["jdbc"]:
        ratios = [j / t for t, j in zip(times["tableq"], times["jdbc"], strict=True)]
        print(f"\nper round (s): tableq {', '.join(f'{x:.1f}' for x in times['tableq'])}; "
              f"jdbc {', '.join(f'{x:.1f}' for x in times['jdbc'])}; tableq speed / JDBC "
              f"speed per round {', '.join(f'{x:.2f}' for x in ratios)}, median "
              f"{statistics.median(ratios):.2f}")
    spark.stop()


def _drop_schemas(base: str, urls: list[str]) -> None:
    """The benchmark's own schemas go when it ends (a benchmark, not the library: raw SQL)."""
    import psycopg

    u = tableq.url.parse_url(base)
    with psycopg.connect(host=u.host, port=u.port or 5432, dbname=u.database,
                         user=u.user or "postgres", password=u.password or None,
                         autocommit=True) as conn:
        for url in urls:
            name = tableq.url.parse_url(url).namespace
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


if __name__ == "__main__":
    main()
