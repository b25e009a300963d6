"""`tableq serve` (the HTTP API, SQS endpoint and dashboard) and `tableq token create |
revoke | list` (its access tokens). The token is printed once, on the last line; only its
hash is stored."""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import click

from tableq.cli import output, setup_logging
from tableq.server.store import Store

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> float:
    """'3600', '30m', '12h', '90d' as seconds."""
    m = _DURATION.match(value.strip())
    if m is None or float(m.group(1)) <= 0:
        raise click.BadParameter(f"{value!r} is not a duration such as 3600, 30m, 12h or 90d")
    return float(m.group(1)) * _UNITS[m.group(2)]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (0.0.0.0 exposes it to the network).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=1 << 20,
              show_default=True, help="Largest request body accepted.")
@click.option("--max-batch", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most messages in one send.")
@click.option("--max-receive", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most messages one receive may ask for.")
@click.option("--metrics-public", is_flag=True,
              help="Serve /metrics without a token (e.g. behind a private network).")
@click.option("--migrate", is_flag=True, help="Apply pending migrations first.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
              case_sensitive=False), default="INFO", show_default=True)
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, max_body_bytes: int, max_batch: int,
          max_receive: int, metrics_public: bool, migrate: bool, log_level: str) -> None:
    """Serve the queue over HTTP: the JSON API under /v1, an SQS-compatible endpoint under
    /sqs, the dashboard at /, /metrics, /healthz and /readyz."""
    try:
        from tableq.server import create_app
        from tableq.server.serve import foreground
    except ImportError as exc:
        raise click.ClickException(f"tableq serve needs the server extra ({exc.name} is "
                                   "missing); run: pip install 'tableq[server]'") from None

    obj = ctx.obj
    setup_logging(obj.debug, log_level)
    _can_listen(host, port)
    queue = obj.queue(migrate=migrate, strict_kinds=False)
    app = create_app(queue, max_body_bytes=max_body_bytes, max_batch=max_batch,
                     max_receive=max_receive, metrics_public=metrics_public)
    click.echo(f"tableq serving {queue.where} on http://{host}:{port} "
               "(Ctrl-C to stop)", err=True)
    try:
        foreground(app, host, port, log_level=log_level.lower())
    finally:
        obj.close()


def _can_listen(host: str, port: int) -> None:
    """Binds host:port once before anything is printed: a port in use or a host that does
    not resolve is one line and exit 1 (uvicorn logged it after the banner and exited 3)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --host or "
            "--port, or stop what listens there") from None


@click.group()
def token() -> None:
    """Access tokens of `tableq serve`: create, revoke, list."""


@token.command("create")
@click.option("--role", type=click.Choice(["producer", "consumer", "reader", "admin"]),
              required=True, help="producer: send; consumer: receive and settle; reader: "
              "view; admin: everything.")
@click.option("--topics", "topics", multiple=True, default=("*",), show_default=True,
              help="Topic scope: an exact name or a glob such as 'orders.*' (repeatable).")
@click.option("--name", default=None, help="A label for the token (shown in lists).")
@click.option("--expires", default=None, metavar="DURATION",
              help="Expire after this long: 3600, 30m, 12h, 90d (default: never).")
@click.option("--sqs", is_flag=True, help="Also make an AWS-style key pair for the SQS "
              "endpoint (printed as AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=...).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines.")
@click.pass_context
def create(ctx: click.Context, role: str, topics: tuple[str, ...], name: str | None,
           expires: str | None, sqs: bool, as_json: bool) -> None:
    """Create a token and print it once (on the last line). Only its hash is stored."""
    from tableq.server.auth import issue

    issued = issue(role, list(topics), name=name, sqs=sqs,
                   expires_in_s=parse_duration(expires) if expires else None)
    Store(ctx.obj.queue()).save_token(issued.record)
    rec = issued.record
    if as_json:
        click.echo(json.dumps({"id": rec.id, "role": rec.role, "topics": list(rec.topics),
                               "name": rec.name, "expires_in_s": rec.expires_in_s,
                               "aws_access_key_id": rec.access_key,
                               "aws_secret_access_key": issued.sqs_secret,
                               "token": issued.secret}))
        return
    click.echo(f"# token {rec.id}: role {rec.role}, topics {', '.join(rec.topics)}"
               + (f", expires in {rec.expires_in_s:g} s" if rec.expires_in_s else ""))
    click.echo("# shown once: store it now (the database keeps only the token's hash"
               + ("; the SQS secret key is stored as it is, for signature checks)" if sqs
                  else ")"))
    if sqs:
        click.echo(f"AWS_ACCESS_KEY_ID={rec.access_key}")
        click.echo(f"AWS_SECRET_ACCESS_KEY={issued.sqs_secret}")
    click.echo(issued.secret)


@token.command("revoke")
@click.argument("token_id")
@click.pass_context
def revoke(ctx: click.Context, token_id: str) -> None:
    """Revoke a token by its id (tqt_...): its next request is refused."""
    if not Store(ctx.obj.queue()).revoke_token(token_id):
        raise click.ClickException(f"no active token {token_id!r}; see `tableq token list`")
    click.echo(f"revoked {token_id}")


@token.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_tokens(ctx: click.Context, as_json: bool) -> None:
    """Tokens with their role, scopes and state (never their secrets)."""
    rows: list[dict[str, Any]] = []
    for t in Store(ctx.obj.queue()).list_tokens():
        state = "revoked" if t.revoked_at else "expired" if t.expired else "active"
        rows.append({"id": t.id, "role": t.role, "topics": list(t.topics), "name": t.name,
                     "sqs": t.access_key is not None, "state": state,
                     "created_at": t.created_at.isoformat(timespec="seconds"),
                     "expires_at": t.expires_at.isoformat(timespec="seconds")
                     if t.expires_at else None})
    if as_json:
        output.json_lines(rows)
        return
    from rich.table import Table

    table = Table(title="tableq tokens", title_justify="left")
    for col in ("id", "role", "topics", "name", "sqs", "state", "created", "expires"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["role"], ", ".join(r["topics"]), r["name"] or "",
                      "yes" if r["sqs"] else "", r["state"], r["created_at"],
                      r["expires_at"] or "never")
    output.stdout.print(table)


COMMANDS = [serve, token]
