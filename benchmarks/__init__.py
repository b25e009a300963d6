"""The side-by-side benchmark suite of issue 15 (`make bench`, `python -m benchmarks`): tableq
beside pgqueuer, procrastinate, PGMQ, huey, persist-queue, kombu and the raw-SQL ceilings.
A program, not tests: it owns its own virtualenv, throwaway servers and RESULTS.md, and
never changes tableq."""
