"""The dashboard at /: every topic's counts, the last hour's charts, a topic page with live
messages and dead letters (requeue and purge, with confirmation), and the health findings of
`tableq doctor` where that exists. Server-rendered HTML, every value escaped; the session is
the token in an HttpOnly SameSite=Strict cookie, set by a login form (never a URL); actions
are POSTs checked for a synchronizer token and for Sec-Fetch-Site / Origin."""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from tableq.doctor import Finding, diagnose
from tableq.errors import AuthenticationFailed, TableqError
from tableq.look import charts, environment, fmt_age, fmt_number
from tableq.server.api import authenticate
from tableq.server.auth import Principal, csrf_matches, csrf_token
from tableq.server.errors import ApiError
from tableq.server.history import points

if TYPE_CHECKING:
    from tableq.server.app import ServerState

router = APIRouter(include_in_schema=False)
COOKIE = "tableq_session"
PEEK_ROWS = 50
DEAD_ROWS = 100
ERRORS_SCAN = 500  # dead letters read per topic to rank the most frequent errors
DOCTOR_CACHE_S = 30.0
_env = environment("tableq.server")


def _state(request: Request) -> ServerState:
    return request.app.state.tableq  # type: ignore[no-any-return]


def _html(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(template).render(**context), status_code=status,
                        headers={"Cache-Control": "no-store"})


async def _session(request: Request) -> tuple[Principal, str] | None:
    secret = request.cookies.get(COOKIE)
    if not secret:
        return None
    try:
        return await run_in_threadpool(authenticate, _state(request), secret), secret
    except AuthenticationFailed:
        return None


def cross_site(headers: Mapping[str, str], host: str) -> bool:
    """True when a browser says the request came from another site (Fetch Metadata), or,
    without that header, when its Origin is not this host. Neither header: not a browser
    form, so only the synchronizer token decides."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is not None:
        return origin == "null" or urlsplit(origin).netloc != host
    return False


FORM_FIELDS_MAX = 1000


async def _form(request: Request) -> dict[str, list[str]]:
    body = (await request.body()).decode("utf-8", "replace")
    try:
        return parse_qs(body, keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX)
    except ValueError:  # more fields than that: no form of the dashboard's has
        raise ApiError(400, "BadRequest", f"the form has more than {FORM_FIELDS_MAX} fields; "
                       "send the dashboard's own form") from None


def _refused(reason: str) -> Response:
    return HTMLResponse(f"<!doctype html><title>refused</title><p>{reason}</p>"
                        .replace("&", "&amp;"), status_code=403)


def _cookie(request: Request, response: Response, secret: str | None) -> None:
    secure = _state(request).config.secure_cookies
    if secure is None:
        secure = request.url.scheme == "https"
    if secret is None:
        response.delete_cookie(COOKIE, path="/", secure=secure, httponly=True,
                               samesite="strict")
    else:
        response.set_cookie(COOKIE, secret, path="/", secure=secure, httponly=True,
                            samesite="strict", max_age=12 * 3600)


def _base(p: Principal, secret: str, st: ServerState) -> dict[str, Any]:
    return {"where": st.queue.where, "who": p, "csrf": csrf_token(secret),
            "refresh_ms": int(st.config.dashboard_refresh_s * 1000)}


# --- login -------------------------------------------------------------------------------------


@router.get("/ui/login")
async def login_page(request: Request) -> Response:
    return _html("login.html", title="tableq: sign in", where="", error=None)


@router.post("/ui/login")
async def login(request: Request) -> Response:
    if cross_site(request.headers, request.url.netloc):
        return _refused("cross-site sign-in refused")
    secret = (await _form(request)).get("token", [""])[0].strip()
    try:
        await run_in_threadpool(authenticate, _state(request), secret)
    except AuthenticationFailed as exc:
        return _html("login.html", status=401, title="tableq: sign in", where="",
                     error=str(exc).split(";")[0])
    response = RedirectResponse("/", status_code=303)
    _cookie(request, response, secret)
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    session = await _session(request)
    form = await _form(request)
    if session is not None and (cross_site(request.headers, request.url.netloc)
                                or not csrf_matches(session[1], form.get("csrf", [""])[0])):
        return _refused("sign-out refused: stale or cross-site form")
    response = RedirectResponse("/ui/login", status_code=303)
    _cookie(request, response, None)
    return response


# --- pages --------------------------------------------------------------------------------------


def _findings(st: ServerState) -> tuple[list[Finding], str | None]:
    """tableq doctor's findings (cached for a while)."""
    now = time.monotonic()
    cached = st.doctor_cache
    if cached is not None and now - cached[0] < DOCTOR_CACHE_S:
        return cached[1], None
    try:
        found = list(diagnose(st.queue))
    except TableqError as exc:
        return [], f"the health checks failed: {str(exc).splitlines()[0]}"
    st.doctor_cache = (now, found)
    return found, None


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no error text)"


def _top_errors(st: ServerState, p: Principal, topics: list[str]) -> list[list[Any]]:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for topic in topics:
        if p.may("view", topic):
            for d in st.queue.dead_letters(topic, limit=ERRORS_SCAN):
                counts[(topic, _last_line(d.error))] += 1
    return [[t, e, fmt_number(n)] for (t, e), n in counts.most_common(10)]


ESTIMATED = ("ready", "scheduled", "in_flight")  # the counts stats() may estimate


def _fields(rows: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    totals = collections.Counter[str]()
    estimated: set[str] = set()  # "~": scaled from a sample of a big table (TopicStats.estimated)
    for s in rows:
        for name in ("ready", "scheduled", "in_flight", "dead", "done"):
            about = "~" if s.estimated and name in ESTIMATED else ""
            out[f"{s.topic}:{name}"] = about + fmt_number(getattr(s, name))
            totals[name] += getattr(s, name)
            if about:
                estimated.add(name)
        out[f"{s.topic}:oldest"] = fmt_age(s.oldest_ready_age)
    for name in ("ready", "scheduled", "in_flight", "dead", "done"):
        out[f"*:{name}"] = ("~" if name in estimated else "") + fmt_number(totals[name])
    oldest = [s.oldest_ready_age for s in rows if s.oldest_ready_age is not None]
    out["*:oldest"] = fmt_age(max(oldest) if oldest else None)
    out["*:topics"] = fmt_number(len(rows))
    return out


def _index(st: ServerState, p: Principal) -> dict[str, Any]:
    rows = [s for s in st.queue.stats() if p.may("stats", s.topic)]
    findings, doctor_note = _findings(st) if p.role in ("admin", "reader") else (
        [], "health checks are shown to reader and admin tokens")
    return {"rows": rows, "fields": _fields(rows),
            "errors": _top_errors(st, p, [s.topic for s in rows if s.dead]),
            "findings": findings, "doctor_note": doctor_note,
            "retention": st.queue.retention}


@router.get("/")
async def index(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return RedirectResponse("/ui/login", status_code=303)
    p, secret = session
    st = _state(request)
    data = await run_in_threadpool(_index, st, p)
    return _html("dashboard.html", title="tableq dashboard", **_base(p, secret, st), **data,
                 quote=quote)


def _topic(st: ServerState, p: Principal, topic: str) -> dict[str, Any]:
    stats = st.queue.stats(topic)[0]
    view = p.may("view", topic)
    return {"s": stats, "fields": _fields([stats]),
            "live": st.queue.peek(topic, PEEK_ROWS) if view else [],
            "dead": st.queue.dead_letters(topic, limit=DEAD_ROWS) if view else [],
            "view": view, "manage": p.may("manage", topic),
            "errors": _top_errors(st, p, [topic]) if stats.dead else [],
            "retention": st.queue.retention}


@router.get("/ui/topic/{topic:path}")
async def topic_page(request: Request, topic: str) -> Response:
    session = await _session(request)
    if session is None:
        return RedirectResponse("/ui/login", status_code=303)
    p, secret = session
    st = _state(request)
    if not p.may("stats", topic):
        return _html("message.html", status=404, title="tableq: not found",
                     **_base(p, secret, st), text="No such topic in this token's scope.")
    try:
        data = await run_in_threadpool(_topic, st, p, topic)
    except TableqError as exc:
        return _html("message.html", status=400, title="tableq", **_base(p, secret, st),
                     text=str(exc))
    done = request.query_params.get("done")
    return _html("topic.html", title=f"tableq: {topic}", **_base(p, secret, st), topic=topic,
                 flash=done if done in ("requeued", "purged") else None,
                 count=request.query_params.get("n", ""), quote=quote, **data)


async def _action(request: Request, what: str) -> Response:
    session = await _session(request)
    if session is None:
        return _refused("not signed in")
    p, secret = session
    if cross_site(request.headers, request.url.netloc):
        return _refused("cross-site request refused")
    form = await _form(request)
    if not csrf_matches(secret, form.get("csrf", [""])[0]):
        return _refused("the form is stale or was not made by this dashboard; reload the page")
    topic = form.get("topic", [""])[0]
    if not p.may("manage", topic):
        return _refused("this token may not change this topic (an admin token may)")
    try:
        ids = [int(i) for i in form.get("id", [])] or None
    except ValueError:
        return _refused("bad message id")
    st = _state(request)
    fn = st.queue.requeue_dead if what == "requeued" else st.queue.purge_dead
    n = await run_in_threadpool(fn, topic, ids)
    if what == "requeued":
        st.wake(topic)
    return RedirectResponse(f"/ui/topic/{quote(topic, safe='')}?done={what}&n={n}",
                            status_code=303)


@router.post("/ui/dead/requeue")
async def requeue(request: Request) -> Response:
    return await _action(request, "requeued")


@router.post("/ui/dead/purge")
async def purge(request: Request) -> Response:
    return await _action(request, "purged")


# --- what the page refreshes -------------------------------------------------------------------


@router.get("/ui/data.json")
async def data(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return JSONResponse({"error": "not signed in"}, status_code=401)
    p = session[0]
    st = _state(request)
    rows = await run_in_threadpool(st.queue.stats)
    return JSONResponse({"fields": _fields([s for s in rows if p.may("stats", s.topic)])},
                        headers={"Cache-Control": "no-store"})


def chart_for(st: ServerState, p: Principal, kind: str, topic: str | None) -> charts.Chart:
    samples = st.history.samples()
    names = sorted({t for s in samples for t in s.stats if p.may("stats", t)})
    if topic is not None:
        names = [topic] if topic in names or p.may("stats", topic) else []
    shown = names[:8]
    note = None if len(names) <= 8 else f"showing 8 of {len(names)} topics"
    series = [(t, points(samples, t)) for t in shown]
    if kind == "backlog":
        return charts.line_chart("Backlog: live messages", [
            (t, [(x.at, float(x.backlog)) for x in pts]) for t, pts in series],
            unit="messages", note=note)
    label = "done" if st.queue.retention else "dead-lettered"
    values = [(t, [(x.at, x.done_per_min if st.queue.retention else x.dead_per_min)
                   for x in pts]) for t, pts in series]
    hint = None if st.queue.retention else ("acked messages are counted only when the queue "
                                            "keeps them (connect(..., retention=True)); the "
                                            "backlog chart shows the net flow")
    return charts.line_chart(f"Throughput: messages {label} per minute", values,
                             unit="per minute", note=note or hint)


@router.get("/ui/chart.svg")
async def chart(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return Response(status_code=401)
    kind = request.query_params.get("kind", "throughput")
    if kind not in ("throughput", "backlog"):
        kind = "throughput"
    c = chart_for(_state(request), session[0], kind, request.query_params.get("topic"))
    svg = _env.get_template("chart.svg").render(c=c)
    return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "no-store"})
