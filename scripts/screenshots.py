"""Screenshots of the dashboard (and of a sample Spark report page) in headless Chromium, for
docs/img/. Seeds a throwaway SQLite queue with a little traffic, serves it, signs in with a
token and saves full-page PNGs.

    .venv/bin/python scripts/screenshots.py docs/img [--report]   (--report needs Spark)
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import tableq
from tableq.server import auth, create_app
from tableq.server.serve import background
from tableq.server.store import Store

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def traffic(q: tableq.Queue, rounds: int) -> None:
    rng = random.Random(7)
    q.send_many("emails", [{"to": f"user{i}@example.com"} for i in range(400)])
    q.send_many("thumbnails", [{"image": f"img/{i}.png", "w": 320} for i in range(250)])
    q.send_many("reports", [{"day": d} for d in range(40)], delay=3600)
    q.send("thumbnails", {"image": "<script>alert('not run')</script>"}, key="<b>bold</b>")
    for _ in range(rounds):
        for topic, fail in (("emails", 0.04), ("thumbnails", 0.12)):
            for m in q.receive(topic, max=rng.randint(10, 30), visibility_timeout=120):
                r = rng.random()
                if r < fail:
                    q.dead_letter(m, rng.choice([
                        "Traceback (most recent call last):\n  ...\nSMTPServerDisconnected: "
                        "Connection unexpectedly closed",
                        "ValueError: image is larger than 50 MB",
                        "TimeoutError: upstream took longer than 30 s"]))
                elif r < 0.85:
                    q.ack(m)
        q.send_many("emails", [{"to": "late@example.com"}] * rng.randint(0, 25))
        time.sleep(0.25)  # let the server's sampler see each step (a demo, not a test)


def main(out: str) -> None:
    from playwright.sync_api import sync_playwright

    Path(out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        q = tableq.connect(f"sqlite:///{tmp}/demo.db", migrate=True, strict_kinds=False,
                           retention=True)
        issued = auth.issue("admin", ["*"], name="ops")
        Store(q).save_token(issued.record)
        app = create_app(q, sample_interval_s=0.25, dashboard_refresh_s=60)
        with background(app) as url, sync_playwright() as p:
            traffic(q, 24)
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url + "/")
            page.screenshot(path=f"{out}/dashboard-login.png")
            page.fill("#token", issued.secret)
            page.click("button[type=submit]")
            page.wait_for_selector("#topics")
            page.screenshot(path=f"{out}/dashboard.png", full_page=True)
            page.click("#topics >> text=thumbnails")
            page.wait_for_selector("#dead")
            page.screenshot(path=f"{out}/dashboard-topic.png", full_page=False)
            if "--report" in sys.argv:
                # The Spark report of the same queue, in the same look.
                from tableq.spark.pipelines.report import report
                from tableq.spark.session import get_session

                spark = get_session("local[2]", app_name="tableq-screenshots")
                report(spark, q._backend.url.raw if hasattr(q._backend.url, "raw")
                       else f"sqlite:///{tmp}/demo.db", html_path=f"{tmp}/report.html")
                spark.stop()
                page.goto(f"file://{tmp}/report.html")
                page.screenshot(path=f"{out}/report.png", full_page=True)
            browser.close()
        q.close()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0] if args else "docs/img")
