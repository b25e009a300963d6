"""A worker app for `tableq worker --api` tests: doubles numbers into another topic, fails
on 'poison'."""

import os

import tableq

app = tableq.App(os.environ.get("TABLEQ_URL", "sqlite:///unused.db"), max_attempts=2)


@app.handler("in", visibility_timeout=30, retry=tableq.Backoff(base=0.01, max=0.01))
def double(message: tableq.Message) -> None:
    if message.payload == "poison":
        raise ValueError("poison payload")
    message.forward("out", {"n": message.payload["n"] * 2})
