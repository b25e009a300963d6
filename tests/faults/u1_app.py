"""The worker app of U1, importable by the old tableq (schema v1) and the current one: each
handler start commits one effect row (history.EffectTable, at least once), then the job
takes $WORK_S seconds and returns (the ack)."""

import os
import time

from history import EffectTable, epoch

from tableq.worker import App

app = App(visibility_timeout=float(os.environ.get("VT_S", "5")), poll_interval_max=0.2)
_table = EffectTable(os.environ["TABLEQ_URL"])


@app.handler("work", concurrency=2)
def work(message) -> None:
    _table.record_now(message.payload["v"], lease=message.lease,
                      until=epoch(message.available_at), worker=os.environ.get("WHO", ""))
    time.sleep(float(os.environ.get("WORK_S", "0.01")))  # the job's own duration
