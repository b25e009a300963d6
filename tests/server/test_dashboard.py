"""H6/H7: the dashboard in headless Chromium from Debian's packages (driven by Playwright with
executable_path; no downloaded browser), on every backend: pages render, numbers match
q.stats(), the refresh picks up changes, requeue works from the browser, hostile payloads in
every shown field execute nothing, and cross-site POSTs and framing are refused."""

from __future__ import annotations

import http.server
import importlib.util
import shutil
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tableq.look import fmt_number
from tableq.server.auth import csrf_token
from tableq.testing import wait_until
from tests.server.conftest import Server, start

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS = [
    "<img src=x onerror=window.__x=1>",
    "</script><script>window.__x=2</script>",
    "javascript:window.__x=3",
    "<svg onload=window.__x=4>",
    "\"><iframe srcdoc='<script>parent.__x=5</script>'>",
    "{{7*7}}<b onmouseover=window.__x=6>hover</b>",
    "<a href=\"javascript:window.__x=7\">click</a>",
    "';window.__x=8;//",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not shutil.which(CHROMIUM):
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium package")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def dash(sq: Any) -> Iterator[Server]:
    yield from start(sq, sample_interval_s=0.2, dashboard_refresh_s=0.3)


def _login(browser: Any, server: Server, token: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(server.url + "/")
    assert page.url.endswith("/ui/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector("#topics")
    return page


def _seed(server: Server) -> None:
    q = server.queue
    q.send_many("emails", [{"to": f"u{i}@example.com"} for i in range(30)])
    for i, text in enumerate(XSS):
        topic = text if server.queue.dialect != "mysql" or len(text) < 200 else "x"
        q.send(topic, {"html": text}, key=text, kind=text, headers={text[:90]: text})
        q.send("hostile", {"html": text, "n": i}, key=f"{text}-{i}", kind="k")
    for m in q.receive("hostile", max=len(XSS)):
        q.dead_letter(m, f"Traceback (most recent call last):\n{m.payload['html']}")
    for m in q.receive("emails", max=5):
        q.dead_letter(m, "SMTPServerDisconnected: Connection unexpectedly closed")


def test_pages_numbers_refresh_requeue_and_no_script_runs(browser: Any, dash: Server) -> None:
    _seed(dash)
    page = _login(browser, dash, dash.token("admin", ["*"]))
    dialogs: list[str] = []

    def unexpected(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", unexpected)
    headers = page.context.request.get(dash.url + "/").headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    # Numbers on the page are the library's numbers.
    for s in dash.queue.stats():
        row = page.locator("#topics tr", has=page.get_by_role("link", name=s.topic, exact=True))
        assert row.count() == 1, s.topic
        for name in ("ready", "scheduled", "in_flight", "dead"):
            cell = row.locator(f"td[data-field$=':{name}']")
            assert cell.inner_text() == fmt_number(getattr(s, name)), (s.topic, name)
    assert page.inner_text("[data-field='*:dead']") == fmt_number(
        sum(s.dead for s in dash.queue.stats()))
    assert "SMTPServerDisconnected" in page.inner_text("#errors")
    # tableq doctor's findings where this tableq has it; a plain note where not.
    if importlib.util.find_spec("tableq.doctor") is None:
        assert "no health checks are available" in page.inner_text("#health-note")
    else:
        assert page.locator("#health tbody tr").count() >= 1
    # Every page with hostile text: shown as text, never run.
    topics = [s.topic for s in dash.queue.stats()]
    for topic in topics:
        page.goto(dash.url + "/ui/topic/" + quote(topic, safe=""))
        page.wait_for_selector("#dead")
        assert page.evaluate("window.__x") is None, topic
        if topic in XSS:
            assert topic in page.inner_text("h1")
    page.goto(dash.url + "/ui/topic/hostile")
    for text in XSS[:3]:
        assert text in page.inner_text("#dead")
    assert dialogs == [] and page.evaluate("window.__x") is None
    # The refresh shows what changed without a reload.
    page.goto(dash.url + "/ui/topic/emails")
    before = dash.queue.stats("emails")[0].ready
    dash.queue.send_many("emails", [{"late": i} for i in range(7)])
    wait_until(lambda: page.inner_text("[data-field='emails:ready']") == fmt_number(before + 7),
               timeout=15)
    # Requeue one dead letter from the browser, confirming the dialog.
    dead_before = dash.queue.stats("emails")[0]
    victim = dash.queue.dead_letters("emails")[0].id
    page.remove_listener("dialog", unexpected)
    page.once("dialog", lambda d: d.accept())
    page.click(f"#dead tr[data-id='{victim}'] button:has-text('requeue')")
    page.wait_for_selector("#flash")
    after = dash.queue.stats("emails")[0]
    assert (after.dead, after.ready) == (dead_before.dead - 1, dead_before.ready + 1)
    assert victim not in [d.id for d in dash.queue.dead_letters("emails")]
    page.context.close()


def test_read_only_token_sees_no_buttons_and_actions_are_refused(browser: Any,
                                                                  dash: Server) -> None:
    _seed(dash)
    reader = dash.token("reader", ["emails"])
    page = _login(browser, dash, reader)
    assert page.locator("#topics a").all_inner_texts() == ["emails"]
    page.goto(dash.url + "/ui/topic/emails")
    assert page.locator("form[action='/ui/dead/requeue']").count() == 0
    r = page.context.request.post(dash.url + "/ui/dead/purge", form={
        "csrf": csrf_token(reader), "topic": "emails"})
    assert r.status == 403
    page.goto(dash.url + "/ui/topic/hostile")
    assert "No such topic" in page.inner_text("main")
    assert dash.queue.stats("emails")[0].dead == 5
    page.context.close()


class _Attacker(http.server.BaseHTTPRequestHandler):
    """Pages of another origin (same machine, other port) that try to act on the dashboard."""

    target = ""

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        pages = {
            "/form": f"""<form id="f" method="post" action="{self.target}/ui/dead/purge">
<input name="topic" value="emails"><input name="csrf" value="guessed"></form>
<script>document.getElementById("f").submit();</script>""",
            "/fetch": f"""<script>window.results = [];
fetch("{self.target}/ui/dead/purge", {{method: "POST", credentials: "include",
  headers: {{"Content-Type": "application/x-www-form-urlencoded"}}, body: "topic=emails"}})
  .then(r => window.results.push(r.status), e => window.results.push("blocked"));</script>""",
            "/frame": f"""<iframe id="framed" src="{self.target}/"></iframe>""",
        }
        data = f"<!doctype html><html><body>{pages.get(self.path, '')}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_cross_site_posts_and_framing_are_refused(browser: Any, dash: Server) -> None:
    _seed(dash)
    page = _login(browser, dash, dash.token("admin", ["*"]))
    handler = type("A", (_Attacker,), {"target": dash.url})
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    other = f"http://127.0.0.1:{evil.server_address[1]}"

    def purge_response(r: Any) -> bool:
        return bool(r.url.startswith(dash.url + "/ui/dead/purge"))

    try:
        # Another origin on this machine (same site, other port): the SameSite cookie goes
        # along, so only the dashboard's own checks stand in the way.
        with page.expect_response(purge_response, timeout=15_000) as form:
            page.goto(other + "/form")
        assert form.value.status == 403
        page.goto(other + "/fetch")
        page.wait_for_function("window.results.length > 0")
        assert page.evaluate("window.results") == ["blocked"]  # no CORS: nothing readable
        # ... and the server refused it too: both cross-site POSTs were answered 403.
        metrics = httpx.get(dash.url + "/metrics", headers={
            "Authorization": f"Bearer {dash.token('admin')}"}).text
        refused = 'route="/ui/dead/purge",status="403"} 2.0'
        assert f"tableq_http_request_duration_seconds_count{{method=\"POST\",{refused}" \
            in metrics
        assert 'route="/ui/dead/purge",status="303"' not in metrics
        page.goto(other + "/frame")
        page.wait_for_load_state("load")
        framed = page.frame_locator("#framed").locator("#topics")
        assert framed.count() == 0  # frame-ancestors 'none': the dashboard never renders
        assert dash.queue.stats("emails")[0].dead == 5
    finally:
        evil.shutdown()
    page.context.close()


def test_csrf_and_fetch_metadata_without_a_browser(dash: Server) -> None:
    _seed(dash)
    token = dash.token("admin", ["*"])
    with httpx.Client(base_url=dash.url, cookies={"tableq_session": token}) as c:
        form = {"topic": "emails", "csrf": csrf_token(token)}
        assert c.post("/ui/dead/purge", data={**form, "csrf": "nope"}).status_code == 403
        assert c.post("/ui/dead/purge", data=form,
                      headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert c.post("/ui/dead/purge", data=form,
                      headers={"Origin": "http://evil.example"}).status_code == 403
        assert dash.queue.stats("emails")[0].dead == 5
        ok = c.post("/ui/dead/purge", data=form, headers={"Sec-Fetch-Site": "same-origin"})
        assert ok.status_code == 303 and dash.queue.stats("emails")[0].dead == 0
        # GET never changes anything; the token is never put in a URL.
        assert c.get("/ui/dead/purge").status_code == 405
    r = httpx.post(dash.url + "/ui/login", data={"token": token},
                   headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = httpx.post(dash.url + "/ui/login", data={"token": token})
    assert r.status_code == 303 and token not in r.headers["location"]
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_estimated_counts_are_marked() -> None:
    from tableq.server.dashboard import _fields
    from tableq.stats import TopicStats
    rows = [TopicStats("big", 9_901_683, 0, 50, 2, 1.5, estimated=True),
            TopicStats("small", 3, 1, 0, 0, None)]
    f = _fields(rows)
    assert f["big:ready"] == "~" + fmt_number(9_901_683) and f["big:dead"] == fmt_number(2)
    assert f["small:ready"] == fmt_number(3) and f["*:ready"] == "~" + fmt_number(9_901_686)
    assert f["*:dead"] == fmt_number(2)
