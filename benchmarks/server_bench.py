"""Server benchmark (a program, not a test): sends and receive+ack per second through the
native API (/v1) and the SQS endpoint (/sqs, boto3), with 1 and 8 client threads, beside the
library called directly in the same run; and the latency a call gains by going through the
server (p50/p99 of one send / one receive+ack, through HTTP minus direct). The server runs
as `tableq serve` in its own process; clients run here. Several interleaved rounds, medians.

    python benchmarks/server_bench.py [--db postgres] [--rounds 3] [--messages 1000]

Each round uses a fresh schema / database / file, dropped at the end. Durability is the
default everywhere (fsync, synchronous_commit on; InnoDB flush at commit; SQLite FULL)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import boto3  # noqa: E402
import botocore.config  # noqa: E402
import httpx  # noqa: E402
from worker_bench import fresh_url  # noqa: E402

import tableq  # noqa: E402
from tableq.client import Client  # noqa: E402
from tableq.server import auth  # noqa: E402
from tableq.server.serve import free_port  # noqa: E402
from tableq.server.store import Store  # noqa: E402

CONCURRENCY = (1, 8)


def timed(fn: Callable[[], Any], n: int, threads: int) -> tuple[float, list[float]]:
    """Runs fn n times over `threads` threads; (calls per second, per-call seconds)."""
    per = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
    lat: list[list[float]] = [[] for _ in range(threads)]

    def run(i: int) -> None:
        for _ in range(per[i]):
            t0 = time.perf_counter()
            fn()
            lat[i].append(time.perf_counter() - t0)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    return n / elapsed, [x for part in lat for x in part]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class Clients:
    """One client of each kind per thread (none of them is shared across threads)."""

    def __init__(self, url: str, base: str, token: str, key: str, secret: str) -> None:
        self.local = threading.local()
        self.url, self.base, self.token, self.key, self.secret = url, base, token, key, secret

    def queue(self) -> tableq.Queue:
        if not hasattr(self.local, "q"):
            self.local.q = tableq.connect(self.url, strict_kinds=False)
        return self.local.q  # type: ignore[no-any-return]

    def api(self) -> Client:
        if not hasattr(self.local, "api"):
            self.local.api = Client(self.base, self.token)
        return self.local.api  # type: ignore[no-any-return]

    def sqs(self) -> Any:
        if not hasattr(self.local, "sqs"):
            self.local.sqs = boto3.client(
                "sqs", endpoint_url=f"{self.base}/sqs", region_name="us-east-1",
                aws_access_key_id=self.key, aws_secret_access_key=self.secret,
                config=botocore.config.Config(retries={"max_attempts": 1}))
        return self.local.sqs


def one_round(dialect: str, n: int, results: dict[str, list[float]],
              lat: dict[str, list[float]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, fresh_url(dialect, Path(tmp)) as url:
        q = tableq.connect(url, migrate=True, strict_kinds=False)
        issued = auth.issue("admin", ["*"], sqs=True)
        Store(q).save_token(issued.record)
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        server = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", url, "serve",
                                   "--port", str(port), "--log-level", "WARNING"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)  # waiting for the server process to listen
            c = Clients(url, base, issued.secret, issued.record.access_key or "",
                        issued.sqs_secret or "")
            qurl = f"{base}/sqs/000000000000/"
            payload = {"to": "user@example.com", "template": "welcome", "n": 1}
            body = '{"to":"user@example.com","template":"welcome","n":1}'
            sends: dict[str, Callable[[str], Callable[[], Any]]] = {
                "direct": lambda t: lambda: c.queue().send(t, payload),
                "/v1": lambda t: lambda: c.api().call(
                    "POST", f"/v1/topics/{t}/messages", {"payload": payload}),
                "/v1 + Idempotency-Key": lambda t: lambda: c.api().send(t, payload),
                "/sqs": lambda t: lambda: c.sqs().send_message(QueueUrl=qurl + t,
                                                                MessageBody=body),
            }

            def take_direct(t: str) -> Callable[[], Any]:
                def go() -> None:
                    for m in c.queue().receive(t, max=1):
                        c.queue().ack(m)
                return go

            def take_api(t: str) -> Callable[[], Any]:
                def go() -> None:
                    for m in c.api().receive(t, max=1):
                        c.api().ack(m)
                return go

            def take_sqs(t: str) -> Callable[[], Any]:
                def go() -> None:
                    got = c.sqs().receive_message(QueueUrl=qurl + t, MaxNumberOfMessages=1)
                    for m in got.get("Messages", []):
                        c.sqs().delete_message(QueueUrl=qurl + t, ReceiptHandle=m["ReceiptHandle"])
                return go

            takes = {"direct": take_direct, "/v1": take_api, "/sqs": take_sqs}
            for conc in CONCURRENCY:
                for name, make in sends.items():
                    topic = f"s{conc}{name.replace('/', '').replace(' ', '').replace('+', '')}"
                    rate, per_call = timed(make(topic), n, conc)
                    results.setdefault(f"send {name} c={conc}", []).append(rate)
                    if conc == 1:
                        lat.setdefault(f"send {name}", []).extend(per_call)
                for name, make in takes.items():
                    topic = f"r{conc}{name.replace('/', '')}"
                    q.send_many(topic, [payload] * n)
                    rate, per_call = timed(make(topic), n, conc)
                    results.setdefault(f"receive+ack {name} c={conc}", []).append(rate)
                    if conc == 1:
                        lat.setdefault(f"receive+ack {name}", []).extend(per_call)
                    left = q.stats(topic)[0].live
                    assert left == 0, f"{left} messages left on {topic}"
        finally:
            server.terminate()
            server.wait(timeout=30)
            q.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="postgres", choices=["sqlite", "postgres", "mysql"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=1000)
    args = ap.parse_args()
    results: dict[str, list[float]] = {}
    lat: dict[str, list[float]] = {}
    for r in range(args.rounds):
        one_round(args.db, args.messages, results, lat)
        print(f"round {r + 1} done", file=sys.stderr)
    print(f"\n{args.db}, {args.messages} messages per cell, {args.rounds} rounds "
          "(median, min-max), msgs/s\n")
    print("| measure | c=1 | c=8 |\n|---|---|---|")
    for kind in ("send", "receive+ack"):
        names = sorted({k.split(" c=")[0] for k in results if k.startswith(kind + " ")},
                       key=lambda k: (0 if "direct" in k else 1, k))
        for name in names:
            cells = []
            for conc in CONCURRENCY:
                v = results[f"{name} c={conc}"]
                cells.append(f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})")
            print(f"| {name} | {cells[0]} | {cells[1]} |")
    print("\nlatency per call at c=1 (ms): p50 / p99, and what the server adds over direct\n")
    print("| call | p50 | p99 | added p50 | added p99 |\n|---|---|---|---|---|")
    for kind in ("send", "receive+ack"):
        d50, d99 = pct(lat[f"{kind} direct"], 0.5), pct(lat[f"{kind} direct"], 0.99)
        for name, values in sorted(lat.items()):
            if not name.startswith(kind + " "):
                continue
            p50, p99 = pct(values, 0.5), pct(values, 0.99)
            added = "" if "direct" in name else f"{(p50 - d50) * 1e3:.2f} | {(p99 - d99) * 1e3:.2f}"
            print(f"| {name} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} | "
                  f"{added or '- | -'} |")


if __name__ == "__main__":
    main()
