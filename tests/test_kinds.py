"""Kinds named by their models: `q.register_kind(Email)` and `q.send("t", Email(...))`, the
typed send options of forward / Transaction.send / App.send, on SQLite, PostgreSQL and
MariaDB (the `q` and `db_url` fixtures)."""

from __future__ import annotations

import msgspec
import pydantic
import pytest

import tableq
from tableq import DuplicateMessage, InvalidArgument, PayloadInvalid


class Email(pydantic.BaseModel):
    to: str
    subject: str = ""


class Sms(msgspec.Struct):
    number: str


def test_a_model_alone_names_its_kind(q: tableq.Queue) -> None:
    assert q.register_kind(Email) == "Email"
    sent = q.send("mail", Email(to="a@b.c", subject="hi"))
    assert sent.status == "sent"
    (m,) = q.receive("mail")
    assert m.kind == "Email"
    assert isinstance(m.payload, Email) and m.payload == Email(to="a@b.c", subject="hi")
    m.ack()
    # A plain value sent as the kind is validated by the model, on send and on receive.
    q.send("mail", {"to": "x@y.z"}, kind="Email")
    with pytest.raises(PayloadInvalid, match="to"):
        q.send("mail", {"subject": "no address"}, kind="Email")
    (m,) = q.receive("mail")
    assert m.payload == Email(to="x@y.z")


def test_send_many_and_items_take_the_kind_of_their_model(q: tableq.Queue) -> None:
    assert q.register_kind(Sms) == "Sms"
    q.register_kind(Email)
    results = q.send_many("out", [Sms(number="1"), {"payload": Sms(number="2"), "key": "k2"},
                                  Email(to="a@b.c"), {"plain": True}])
    assert [r.status for r in results] == ["sent"] * 4 and results[1].key == "k2"
    got = q.receive("out", max=10)
    assert [m.kind for m in got] == ["Sms", "Sms", "Email", None]
    assert [m.payload for m in got] == [Sms(number="1"), Sms(number="2"), Email(to="a@b.c"),
                                        {"plain": True}]


def test_the_named_form_still_works_and_also_names_the_model(q: tableq.Queue) -> None:
    assert q.register_kind("email", model=Email) == "email"
    q.send("mail", Email(to="a@b.c"))
    (m,) = q.receive("mail")
    assert m.kind == "email" and m.payload == Email(to="a@b.c")
    # Registered again with functions, "email" no longer names Email instances.
    q.register_kind("email", encode=lambda v: v, decode=lambda v: v)
    with pytest.raises(PayloadInvalid, match=r"register_kind\(Email\)"):
        q.send("mail", Email(to="a@b.c"))


def test_register_kind_refuses_a_class_that_is_not_a_model(q: tableq.Queue) -> None:
    with pytest.raises(InvalidArgument, match="pydantic model class or msgspec Struct"):
        q.register_kind(dict)
    with pytest.raises(InvalidArgument, match="takes the model alone"):
        q.register_kind(Email, model=Email)
    assert q._kinds.names() == []


def test_forward_and_transaction_send_take_the_send_options(q: tableq.Queue) -> None:
    q.register_kind(Email)
    q.send("in", 1)
    q.send("in", 2)
    (m,) = q.receive("in")
    r = m.forward("next", Email(to="a@b.c"), key="k", priority=3, headers={"h": "v"})
    assert (r.status, r.key) == ("sent", "k")
    with q.transaction() as tx:
        (m,) = tx.receive("in")
        with pytest.raises(DuplicateMessage):
            tx.send("next", {"again": True}, key="k", on_duplicate="error")
        r = m.forward("next", Email(to="c@d.e"), key="k", on_duplicate="replace")
        assert r.status == "replaced"
    (n,) = q.receive("next")
    assert (n.kind, n.priority, n.payload) == ("Email", 0, Email(to="c@d.e"))
    assert q.stats("in")[0].live == 0


def test_app_send_takes_the_send_options(db_url: str) -> None:
    app = tableq.App(db_url, migrate=True)
    try:
        app.queue.register_kind(Email)
        first = app.send("t", Email(to="a@b.c"), key="k", priority=5)
        again = app.send("t", Email(to="x@y.z"), key="k", on_duplicate="ignore")
        assert (first.status, again.status, again.id) == ("sent", "duplicate", first.id)
        (m,) = app.queue.receive("t")
        assert (m.priority, m.payload) == (5, Email(to="a@b.c"))
    finally:
        app.close()
