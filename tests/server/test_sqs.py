"""The SQS endpoint with unmodified SQS clients (boto3 and the aws CLI) pointed at a running
server, on every backend: the round trip with long polling and visibility changes, stale
receipt handles, signatures, scopes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

from tableq.server.store import Store
from tableq.testing import wait_until
from tests.server.conftest import Server


def sqs_client(server: Server, key: str, secret: str, region: str = "eu-west-3") -> Any:
    return boto3.client(
        "sqs", endpoint_url=f"{server.url}/sqs", region_name=region,
        aws_access_key_id=key, aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=40))


@pytest.fixture
def sqs(server: Server) -> Any:
    issued = server.issue("admin", ["*"], sqs=True)
    return sqs_client(server, issued.record.access_key, issued.sqs_secret)  # type: ignore[arg-type]


def _code(exc: botocore.exceptions.ClientError) -> str:
    return exc.response["Error"]["Code"]


def test_boto3_round_trip(server: Server, sqs: Any) -> None:
    url = sqs.create_queue(QueueName="orders")["QueueUrl"]
    assert url == f"{server.url}/sqs/000000000000/orders"
    assert sqs.get_queue_url(QueueName="orders")["QueueUrl"] == url
    sent = sqs.send_message(QueueUrl=url, MessageBody='{"order": 1}',
                            MessageAttributes={"trace": {"DataType": "String",
                                                         "StringValue": "t-1"},
                                               "n": {"DataType": "Number",
                                                     "StringValue": "7"}})
    assert sent["MD5OfMessageBody"] == hashlib.md5(b'{"order": 1}').hexdigest()
    assert len(sent["MD5OfMessageAttributes"]) == 32 and sent["MessageId"].isdigit()
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "second", "MessageDeduplicationId": "k1"},
        {"Id": "b", "MessageBody": "later", "DelaySeconds": 600},
        {"Id": "c", "MessageBody": "dup", "MessageDeduplicationId": "k1"},
        {"Id": "d", "MessageBody": ""}])
    assert [s["Id"] for s in batch["Successful"]] == ["a", "b", "c"]
    assert batch["Successful"][0]["MessageId"] == batch["Successful"][2]["MessageId"]
    assert [(f["Id"], f["Code"]) for f in batch["Failed"]] == [("d", "MissingParameter")]
    assert sorted(sqs.list_queues(QueueNamePrefix="ord")["QueueUrls"]) == [url]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesDelayed"],
            attrs["ApproximateNumberOfMessagesNotVisible"]) == ("2", "1", "0")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60,
                              MessageAttributeNames=["All"], AttributeNames=["All"])
    msgs = got["Messages"]
    assert [m["Body"] for m in msgs] == ['{"order": 1}', "second"]
    first = msgs[0]
    assert first["MessageAttributes"]["trace"] == {"DataType": "String", "StringValue": "t-1"}
    assert first["MessageAttributes"]["n"]["DataType"] == "Number"
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessagesNotVisible"])["Attributes"] == {
        "ApproximateNumberOfMessagesNotVisible": "2"}
    # Visibility: extend one, give the other back at once.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                  VisibilityTimeout=300)
    assert server.queue.get(int(first["MessageId"])).available_at > server.queue.now()  # type: ignore[union-attr]
    sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": msgs[1]["ReceiptHandle"], "VisibilityTimeout": 0}])
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60,
                                AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again] == [
        ("second", "2")]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    done = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "1", "ReceiptHandle": again[0]["ReceiptHandle"]},
        {"Id": "2", "ReceiptHandle": msgs[1]["ReceiptHandle"]}])  # stale: re-received since
    assert [s["Id"] for s in done["Successful"]] == ["1"]
    assert [(f["Id"], f["Code"]) for f in done["Failed"]] == [("2", "ReceiptHandleIsInvalid")]
    stats = server.queue.stats("orders")[0]
    assert (stats.ready, stats.in_flight, stats.scheduled) == (0, 0, 1)
    sqs.purge_queue(QueueUrl=url)
    assert server.queue.stats("orders")[0].live == 0


def test_long_polling_and_stale_receipts(server: Server, sqs: Any) -> None:
    url = sqs.create_queue(QueueName="lp")["QueueUrl"]
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages") is None
    got: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        got["r"] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=15)
        got["s"] = time.monotonic() - started

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: server.app.state.tableq.waiter._waiting.get("lp"), timeout=10)
    server.queue.send("lp", "straight into the database")
    t.join(20)
    assert got["r"]["Messages"][0]["Body"] == "straight into the database"
    assert got["s"] < 10
    handle = got["r"]["Messages"][0]["ReceiptHandle"]
    # Make the first receipt stale: its lease ends, another receive takes the message.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    fresh = sqs.receive_message(QueueUrl=url)["Messages"][0]
    for call in (lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle=handle),
                 lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle,
                                                       VisibilityTimeout=30)):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            call()
        assert _code(err.value) == "ReceiptHandleIsInvalid"
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert _code(err.value) == "ReceiptHandleIsInvalid"
    assert server.queue.stats("lp")[0].in_flight == 1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=fresh["ReceiptHandle"])
    assert server.queue.stats("lp")[0].live == 0


def test_signatures_and_scopes(server: Server) -> None:
    good = server.issue("consumer", ["mine.*"], sqs=True)
    key, secret = good.record.access_key, good.sqs_secret
    assert key and secret
    server.queue.send("mine.a", "hello")
    server.queue.send("theirs", "private")
    base = f"{server.url}/sqs/000000000000/"
    forged = sqs_client(server, key, secret[:-2] + "xx")
    with pytest.raises(botocore.exceptions.ClientError) as err:
        forged.receive_message(QueueUrl=base + "mine.a")
    assert _code(err.value) == "SignatureDoesNotMatch"
    unknown = sqs_client(server, "TQ" + "A" * 18, secret)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        unknown.list_queues()
    assert _code(err.value) == "InvalidClientTokenId"
    c = sqs_client(server, key, secret, region="ap-south-1")  # any region signs
    assert c.receive_message(QueueUrl=base + "mine.a")["Messages"][0]["Body"] == "hello"
    assert [u.rsplit("/", 1)[1] for u in c.list_queues()["QueueUrls"]] == ["mine.a"]
    for call in (lambda: c.receive_message(QueueUrl=base + "theirs"),
                 lambda: c.send_message(QueueUrl=base + "mine.a", MessageBody="x"),
                 lambda: c.purge_queue(QueueUrl=base + "mine.a")):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            call()
        assert _code(err.value) == "AccessDenied"
    Store(server.queue).revoke_token(good.record.id)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        c.list_queues()
    assert _code(err.value) == "InvalidClientTokenId"
    assert server.queue.stats("theirs")[0].ready == 1
    import httpx

    r = httpx.post(f"{server.url}/sqs", headers={"X-Amz-Target": "AmazonSQS.ListQueues",
                                                 "Content-Type": "application/x-amz-json-1.0"},
                   content=b"{}")
    assert r.status_code == 403 and json.loads(r.text)["__type"].endswith(
        "MissingAuthenticationToken")


def test_aws_cli_round_trip(server: Server) -> None:
    issued = server.issue("admin", ["cli"], sqs=True)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": issued.record.access_key or "",
           "AWS_SECRET_ACCESS_KEY": issued.sqs_secret or "", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    aws = [sys.executable, "-m", "awscli", "sqs", "--endpoint-url", f"{server.url}/sqs",
           "--output", "json"]
    url = f"{server.url}/sqs/000000000000/cli"

    def run(*args: str) -> Any:
        done = subprocess.run([*aws, *args], capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else None

    assert run("create-queue", "--queue-name", "cli")["QueueUrl"] == url
    run("send-message", "--queue-url", url, "--message-body", "from the aws cli")
    got = run("receive-message", "--queue-url", url, "--wait-time-seconds", "2")
    assert got["Messages"][0]["Body"] == "from the aws cli"
    run("delete-message", "--queue-url", url, "--receipt-handle",
        got["Messages"][0]["ReceiptHandle"])
    assert server.queue.stats("cli")[0].live == 0


def _signed(server: Server, op: str | None, body: dict[str, Any],
            target_after_signing: str | None = None,
            added: dict[str, str] | None = None) -> Any:
    """A request signed as botocore signs it (an admin key pair), sent with httpx, so that
    its fields can be what boto3 would never send. `target_after_signing` adds an
    X-Amz-Target header the signature does not cover, `added` other headers."""
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    import httpx

    issued = server.issue("admin", ["*"], sqs=True)
    creds = botocore.credentials.Credentials(issued.record.access_key, issued.sqs_secret)
    headers = {"Content-Type": "application/x-amz-json-1.0"}
    if op is not None:
        headers["X-Amz-Target"] = f"AmazonSQS.{op}"
    req = botocore.awsrequest.AWSRequest("POST", f"{server.url}/sqs",
                                         data=json.dumps(body).encode(), headers=headers)
    botocore.auth.SigV4Auth(creds, "sqs", "eu-west-3").add_auth(req)
    sent = dict(req.headers.items())
    if target_after_signing is not None:
        sent["X-Amz-Target"] = f"AmazonSQS.{target_after_signing}"
    sent.update(added or {})
    return httpx.post(req.url, headers=sent, content=req.body)


def test_a_queue_url_in_another_servers_form_names_its_last_part(server: Server,
                                                                  sqs: Any) -> None:
    """Found by review: a QueueUrl without /sqs/ (AWS's, LocalStack's /<account>/<name>)
    became a topic named after its whole path ("/123456789012/s1"), which nobody reads."""
    for url in ("https://sqs.us-east-1.amazonaws.com/123456789012/s1",
                "http://localhost:4566/000000000000/s1"):
        sqs.send_message(QueueUrl=url, MessageBody="x")
    assert server.queue.stats("s1")[0].ready == 2
    assert [s.topic for s in server.queue.stats()] == ["s1"]


def test_malformed_fields_get_an_sqs_error(server: Server) -> None:
    """Signed requests whose fields have the wrong JSON types or values (which boto3 would
    never send, but other clients might) get InvalidParameterValue, not a 500, before
    anything is stored."""
    url = f"{server.url}/sqs/000000000000/bad"
    server.queue.send("bad", "kept")

    def attr(data_type: Any, value: Any, name: str = "a") -> dict[str, Any]:
        return {"QueueUrl": url, "MessageBody": "x",
                "MessageAttributes": {name: {"DataType": data_type, "StringValue": value}}}

    for op, body in [
        ("SendMessage", attr(5, "1")),
        ("SendMessage", attr("String", 1)),
        ("SendMessage", attr("String.\ud800", "1")),  # answered 500 after storing it
        ("SendMessage", attr("Binary", "AAAA")),
        ("SendMessage", attr("Number", "seven")),
        ("SendMessage", attr("String", "a\x00b")),
        ("SendMessage", attr("String", "1", name="AWS.trace")),
        ("SendMessage", attr("String", "1", name="amazon.trace")),
        ("SendMessage", attr("String", "1", name="n" * 150)),  # over the library's limit
        ("SendMessage", {"QueueUrl": url, "MessageBody": "\ud800"}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": "a\x00b"}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": "x", "MessageDeduplicationId": ""}),
        ("ReceiveMessage", {"QueueUrl": url, "AttributeNames": [{"a": 1}]}),
        ("ReceiveMessage", {"QueueUrl": url, "MessageAttributeNames": "All"}),
        ("GetQueueAttributes", {"QueueUrl": url, "AttributeNames": [1]}),
        ("ListQueues", {"QueueNamePrefix": 5}),
        ("ListQueues", {"QueueNamePrefix": ["a"]}),
    ]:
        r = _signed(server, op, body)
        assert r.status_code == 400, (op, body, r.text)
        assert r.json()["__type"].endswith("InvalidParameterValue"), r.text
    stats = server.queue.stats("bad")[0]
    assert (stats.ready, stats.in_flight) == (1, 0)


def test_a_refused_batch_entry_fails_alone(server: Server) -> None:
    """SendMessageBatch answers each entry: one the SQS rules or the library refuse (here
    the queue's own payload limit, below SQS's) is in Failed, the others are sent."""
    url = f"{server.url}/sqs/000000000000/batch"
    server.queue.max_payload_bytes = 1_000
    r = _signed(server, "SendMessageBatch", {"QueueUrl": url, "Entries": [
        {"Id": "ok", "MessageBody": "fine"},
        {"Id": "nul", "MessageBody": "a\x00b"},
        {"Id": "name", "MessageBody": "x", "MessageAttributes": {
            "n" * 150: {"DataType": "String", "StringValue": "1"}}},
        {"Id": "big", "MessageBody": "x" * 2_000},
        {"Id": "ok2", "MessageBody": "also fine"}]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [s["Id"] for s in out["Successful"]] == ["ok", "ok2"]
    assert {f["Id"]: (f["Code"], f["SenderFault"]) for f in out["Failed"]} == {
        "nul": ("InvalidParameterValue", True), "name": ("InvalidParameterValue", True),
        "big": ("InvalidParameterValue", True)}
    assert [m.payload for m in server.queue.peek("batch", 10)] == ["fine", "also fine"]


def test_a_batch_with_bad_or_repeated_entry_ids_is_refused_whole(server: Server) -> None:
    """As SQS: an entry Id is 1-80 of A-Z, a-z, 0-9, - and _, unique in its batch; otherwise
    the whole request fails and nothing is sent."""
    url = f"{server.url}/sqs/000000000000/ids"
    bad = [["ok", "a b"], ["ok", "é"], ["ok", "x" * 81], ["ok", ""], ["ok", "a\n"], ["ok", 5]]
    for ids, code in [*((b, "InvalidBatchEntryId") for b in bad),
                      (["a", "a"], "BatchEntryIdsNotDistinct")]:
        r = _signed(server, "SendMessageBatch", {"QueueUrl": url, "Entries": [
            {"Id": i, "MessageBody": "x"} for i in ids]})
        assert r.status_code == 400 and r.json()["__type"].endswith(code), (ids, r.text)
    r = _signed(server, "SendMessageBatch", {"QueueUrl": url, "Entries": [
        {"Id": "A-z_09" + "x" * 74, "MessageBody": "x"}]})
    assert r.status_code == 200 and r.json()["Successful"], r.text
    assert len(server.queue.peek("ids", 10)) == 1


def test_headers_written_over_the_native_api_do_not_break_sqs_receives(server: Server,
                                                                      sqs: Any) -> None:
    """The header SQS keeps its data types in can be written by anyone over /v1 or the
    library; a value that is not ours reads as String attributes, and the receive works."""
    url = sqs.create_queue(QueueName="mixed")["QueueUrl"]
    server.queue.send("mixed", "a", headers={"sqs-attribute-types": "not json", "n": "1"})
    server.queue.send("mixed", "b", headers={"sqs-attribute-types": '{"n": 5}', "n": "2"})
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                              MessageAttributeNames=["All"])["Messages"]
    assert [(m["Body"], m["MessageAttributes"]) for m in got] == [
        ("a", {"n": {"DataType": "String", "StringValue": "1"}}),
        ("b", {"n": {"DataType": "String", "StringValue": "2"}})]


def test_the_headers_that_say_what_a_request_does_must_be_signed(server: Server) -> None:
    """A captured request whose X-Amz-Target was not signed cannot be replayed as another
    action (here a GetQueueAttributes turned into a PurgeQueue). An x-amz header added on
    the way (a CDN's request id) is no reason to refuse."""
    url = f"{server.url}/sqs/000000000000/kept"
    server.queue.send("kept", "x")
    r = _signed(server, None, {"QueueUrl": url}, target_after_signing="PurgeQueue")
    assert r.status_code == 400 and r.json()["__type"].endswith("IncompleteSignature"), r.text
    assert "x-amz-target" in r.json()["message"]
    assert server.queue.stats("kept")[0].ready == 1
    assert _signed(server, "GetQueueAttributes", {"QueueUrl": url}).status_code == 200
    assert _signed(server, "GetQueueAttributes", {"QueueUrl": url},
                   added={"X-Amz-Cf-Id": "abc=="}).status_code == 200


def test_sqs_rules_for_dedup_ids_attribute_names_json_and_body_size(sq: Any) -> None:
    """Answered as SQS answers (found by review): a MessageDeduplicationId is 1-128 of
    letters, digits and punctuation (129 characters were accepted); an attribute name SQS
    does not define is InvalidAttributeName (it got {}), one it defines that tableq has no
    value for is left out; a body that is not JSON is SerializationException; a request
    over --max-body-bytes gets the SQS error shape, with or without a Content-Length (it got
    the native API's)."""
    import httpx

    from tests.server.conftest import start

    for server in start(sq, max_body_bytes=4_096):
        issued = server.issue("admin", ["*"], sqs=True)
        sqs = sqs_client(server, issued.record.access_key, issued.sqs_secret)  # type: ignore[arg-type]
        url = sqs.create_queue(QueueName="rules")["QueueUrl"]
        for bad in ("d" * 129, "has space", "é"):
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId=bad)
            assert _code(refused.value) == "InvalidParameterValue", bad
        edge = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "a" * 96
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId=edge)
        assert [m.key for m in sq.peek("rules")] == [edge]

        with pytest.raises(botocore.exceptions.ClientError) as unknown:
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["NoSuchThing"])
        assert _code(unknown.value) == "InvalidAttributeName"
        assert "NoSuchThing" in str(unknown.value)
        assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get(
            "Attributes", {}) == {}

        r = _signed_raw(server, "SendMessage", b'{"QueueUrl": ')
        assert r.status_code == 400 and r.json()["__type"].endswith("SerializationException")

        big = json.dumps({"QueueUrl": url, "MessageBody": "y" * 5_000}).encode()
        headers = {"X-Amz-Target": "AmazonSQS.SendMessage",
                   "Content-Type": "application/x-amz-json-1.0"}
        sized = httpx.post(f"{server.url}/sqs", content=big, headers=headers)
        streamed = httpx.post(f"{server.url}/sqs", content=iter([big[:2_000], big[2_000:]]),
                              headers=headers)
        for r in (sized, streamed):
            assert r.status_code == 413, r.text
            assert r.json()["__type"].endswith("RequestTooLarge"), r.text
            assert r.headers["x-amzn-query-error"] == "RequestTooLarge;Sender"
            assert "--max-body-bytes" in r.json()["message"]
        assert len(sq.peek("rules")) == 1


def _signed_raw(server: Server, op: str, raw: bytes) -> Any:
    """A signed request whose body is `raw` bytes (not JSON)."""
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    import httpx

    issued = server.issue("admin", ["*"], sqs=True)
    creds = botocore.credentials.Credentials(issued.record.access_key, issued.sqs_secret)
    req = botocore.awsrequest.AWSRequest("POST", f"{server.url}/sqs", data=raw, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{op}"})
    botocore.auth.SigV4Auth(creds, "sqs", "eu-west-3").add_auth(req)
    return httpx.post(req.url, headers=dict(req.headers.items()), content=req.body)
