"""Spark benchmark: bulk enqueue into PostgreSQL through the tableq writer vs Spark's own JDBC
writer into the same kind of table (tableq's message table, same indexes, in a second schema)
and vs a bare COPY of the same rows from one Python connection, in the same run; then
streaming consume throughput beside a Spark JDBC batch read of the same rows. Part of
`python -m benchmarks` (scenario spark); also runs alone:

    .venv/bin/python benchmarks/spark_bench.py --rows 1000000 --stream-rows 200000

Needs Debian's pgJDBC jar for the comparisons: apt-get install -y libpostgresql-jdbc-java."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import tableq
import tableq.url
from tableq.bulk import Bulk
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
    args = _args()
    out = measure(args.url, rows=args.rows, stream_rows=args.stream_rows,
                  max_rows=args.max_rows, partitions=args.partitions, rounds=args.rounds,
                  master=args.master)
    print(f"\nPostgreSQL, {args.master}, {args.partitions} partitions, pyspark "
          f"{out['spark_version']}\n")
    print("| path | rows | rows/s |")
    print("|---|---:|---:|")
    for name, rows, rate in out["table"]:
        print(f"| {name} | {rows:,} | {rate:,.0f} |")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get(
        "TABLEQ_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--stream-rows", type=int, default=200_000)
    ap.add_argument("--max-rows", type=int, default=50_000, help="stream micro-batch size")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="batch write rounds (medians)")
    ap.add_argument("--master", default="local[2]")
    return ap.parse_args()


def measure(base_url: str, *, rows: int, stream_rows: int, max_rows: int = 50_000,
            partitions: int = 2, rounds: int = 3, master: str = "local[2]") -> dict[str, Any]:
    """Runs every path once per round (writers alternate order) and returns rows/s."""
    args = argparse.Namespace(url=base_url, rows=rows, stream_rows=stream_rows,
                              max_rows=max_rows, partitions=partitions, rounds=rounds,
                              master=master)
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
        assert q.stats("bench", exact=True)[0].ready == n, q.stats("bench", exact=True)
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
        assert q.stats("bench", exact=True)[0].ready == n, q.stats("bench", exact=True)
        q.close()
        return took

    def copy_write(url: str) -> float:
        """The same rows by one psycopg COPY into the same table: the floor for a writer."""
        import json

        import psycopg

        q = tableq.connect(url, migrate=True)
        schema = tableq.url.parse_url(url).namespace
        u = tableq.url.parse_url(args.url)
        with psycopg.connect(host=u.host, port=u.port or 5432, dbname=u.database,
                             user=u.user or "postgres") as conn:
            t = time.perf_counter()
            with conn.cursor().copy(f"COPY {schema}.message (topic, payload, available_at, "
                                    "first_available_at) FROM STDIN") as cp:
                for i in range(n):
                    now = "now"
                    cp.write_row(("bench", json.dumps({"n": i, "s": f"payload-{i}"}), now, now))
            conn.commit()
            took = time.perf_counter() - t
        assert q.stats("bench", exact=True)[0].ready == n, q.stats("bench", exact=True)
        q.close()
        return took

    # Rounds alternate the writers' order; each writes into a fresh schema.
    schemas = [warm]
    writers = {"tableq": tableq_write, "jdbc": jdbc_write, "copy": copy_write}
    times: dict[str, list[float]] = {name: [] for name in writers}
    if not have_jar:
        print(f"(no {JAR}: JDBC comparisons skipped)", file=sys.stderr)
        del writers["jdbc"]
    tq_url = ""
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
    out: dict[str, Any] = {"spark_version": spark.version, "table": results,
                           "write_s": times["tableq"], "jdbc_write_s": times["jdbc"],
                           "copy_s": times["copy"]}
    out["write_rate"] = n / statistics.median(times["tableq"])
    out["copy_rate"] = n / statistics.median(times["copy"])
    results.append((f"batch write: tableq writer (exactly once; median of {args.rounds})", n,
                    out["write_rate"]))
    if times["jdbc"]:
        out["jdbc_write_rate"] = n / statistics.median(times["jdbc"])
        results.append(("batch write: Spark JDBC writer into the same table (per-task "
                        f"commits, not exactly once; median of {args.rounds})", n,
                        out["jdbc_write_rate"]))
    results.append((f"bare COPY of the same rows, one connection (median of {args.rounds})", n,
                    out["copy_rate"]))

    m = args.stream_rows
    ck = tempfile.mkdtemp(prefix="tableq-bench-ck-")
    try:
        for topic in ("stream-a", "stream-b"):
            frame(m).write.format("tableq").option("url", tq_url).option("topic", topic) \
                .mode("append").save()
        if have_jar:
            # A JDBC batch read of the same rows (id-partitioned, into a noop sink).
            schema = tableq.url.parse_url(tq_url).namespace
            jdbc, user, password = _jdbc_url(args.url)
            lo, hi = Bulk(q).history_bounds("live", "stream-a") or (0, 0)
            t = time.perf_counter()
            (spark.read.format("jdbc").option("url", jdbc)
             .option("driver", "org.postgresql.Driver").option("user", user)
             .option("password", password)
             .option("dbtable", f"(SELECT id, payload, attempts FROM {schema}.message "
                                "WHERE topic = 'stream-a') m")
             .option("partitionColumn", "id").option("lowerBound", str(lo))
             .option("upperBound", str(hi + 1)).option("numPartitions", str(parts))
             .option("fetchsize", "10000").load()
             .write.format("noop").mode("overwrite").save())
            out["jdbc_read_rate"] = m / (time.perf_counter() - t)
            results.append(("Spark JDBC batch read of the same rows -> noop (no lease, no ack)",
                            m, out["jdbc_read_rate"]))
        # Consume: an AvailableNow query drains a topic of m messages into a noop sink. Timed
        # end to end (the query's start included), and from the end of its first
        # micro-batch on (a long-running stream's rate, which pays that start once).
        batches = _batches()
        spark.streams.addListener(batches)
        t = time.perf_counter()
        (spark.readStream.format("tableq").option("url", tq_url).option("topic", "stream-a")
         .option("maxRows", str(args.max_rows)).load()
         .writeStream.format("noop").option("checkpointLocation", f"{ck}/a")
         .trigger(availableNow=True).start().awaitTermination())
        end = time.perf_counter()
        spark.streams.removeListener(batches)
        out["stream_rate"] = m / (end - t)
        out["stream_start_s"], out["stream_steady_rate"] = batches.steady(t, end, m)
        assert not q.stats("stream-a", exact=True) or q.stats("stream-a", exact=True)[0].live == 0
        results.append((f"stream read (maxRows={args.max_rows}) -> noop, acked, end to end", m,
                        out["stream_rate"]))
        results.append((f"stream read, micro-batches after the first (the first ended "
                        f"{out['stream_start_s']:.1f} s after start)", m - batches.first_rows,
                        out["stream_steady_rate"]))
        # Topic to topic, exactly once: stream-b -> moved through the tableq sink.
        t = time.perf_counter()
        (spark.readStream.format("tableq").option("url", tq_url).option("topic", "stream-b")
         .option("maxRows", str(args.max_rows)).load()
         .select("payload").writeStream.format("tableq").option("url", tq_url)
         .option("topic", "moved").option("payloadFormat", "json")
         .option("sinkName", "bench").option("checkpointLocation", f"{ck}/b")
         .trigger(availableNow=True).start().awaitTermination())
        out["a_to_b_rate"] = m / (time.perf_counter() - t)
        moved = q.stats("moved", exact=True)[0].ready
        assert moved == m, (moved, m)
        results.append((f"stream a -> b through the tableq sink (maxRows={args.max_rows})",
                        moved, out["a_to_b_rate"]))
    finally:
        shutil.rmtree(ck, ignore_errors=True)
    q.close()
    _drop_schemas(args.url, schemas)
    spark.stop()
    return out


def _batches() -> Any:
    """A streaming query listener that notes when each micro-batch ended (its progress
    event) and its rows. Defined here: pyspark is imported only when the benchmark runs."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Batches(StreamingQueryListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ends: list[tuple[float, int]] = []

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            rows = int(event.progress.numInputRows)
            if rows:
                self.ends.append((time.perf_counter(), rows))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        @property
        def first_rows(self) -> int:
            return self.ends[0][1] if self.ends else 0

        def steady(self, began: float, end: float, rows: int) -> tuple[float, float]:
            """Seconds from the start to the end of the first micro-batch, and the rows/s
            of the rest, to the query's end."""
            if len(self.ends) < 2:
                return end - began, 0.0
            first_end, first_rows = self.ends[0]
            return first_end - began, (rows - first_rows) / (end - first_end)

    return Batches()


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
