"""AWS Signature Version 4, checked on the server side for the SQS endpoint: parse the
Authorization header, rebuild the canonical request, recompute the signature with the token's
secret key, compare in constant time. Pure functions; the clock is passed in."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60  # what AWS allows between the signer's clock and the service's
# Headers that change what a request does or when it was made: signed whenever present.
# Other x-amz-* headers may be added on the way (a CDN's X-Amz-Cf-Id, say).
MEANING_HEADERS = ("x-amz-target", "x-amz-date", "x-amz-security-token",
                   "x-amz-content-sha256")
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-f]{64})\s*$")


class SignatureError(Exception):
    """A request whose signature cannot be accepted; `code` is the AWS error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Credential:
    access_key: str
    date: str  # YYYYMMDD
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def parse_authorization(header: str | None) -> Credential:
    if not header:
        raise SignatureError("MissingAuthenticationToken",
                             "the request has no AWS Signature V4 Authorization header; sign "
                             "it with the token's access key pair (AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY from `tableq token create --sqs`)")
    m = _AUTH.match(header.strip())
    if m is None:
        raise SignatureError("IncompleteSignature",
                             "the Authorization header is not a complete AWS4-HMAC-SHA256 "
                             "signature (Credential, SignedHeaders, Signature)")
    parts = m.group("cred").split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not re.fullmatch(r"\d{8}", parts[1]):
        raise SignatureError("IncompleteSignature", "the credential scope is malformed")
    signed = tuple(m.group("signed").split(";"))
    if "host" not in signed or list(signed) != sorted(signed):
        raise SignatureError("IncompleteSignature",
                             "SignedHeaders must be sorted and include host")
    return Credential(parts[0], parts[1], parts[2], parts[3], signed, m.group("sig"))


def _trim(value: str) -> str:
    return " ".join(value.strip().split())


def canonical_request(method: str, path: str, query: str, headers: Mapping[str, str],
                      signed_headers: tuple[str, ...], payload_sha256: str) -> str:
    """The canonical form that was signed. `path` is the request path as sent (still
    percent-encoded); it is encoded once more, as SigV4 asks of every service but S3."""
    canonical_path = quote(path or "/", safe="/~")
    pairs = []
    for item in query.split("&") if query else []:
        k, _, v = item.partition("=")
        pairs.append((quote(k, safe="-_.~"), quote(v, safe="-_.~")))
    canonical_query = "&".join(f"{k}={v}" for k, v in sorted(pairs))
    canonical_headers = "".join(f"{h}:{_trim(headers.get(h, ''))}\n" for h in signed_headers)
    return "\n".join([method.upper(), canonical_path, canonical_query, canonical_headers,
                      ";".join(signed_headers), payload_sha256])


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = _hmac(("AWS4" + secret).encode("utf-8"), date)
    return _hmac(_hmac(_hmac(k, region), service), "aws4_request")


def request_time(headers: Mapping[str, str]) -> tuple[str, datetime]:
    stamp = headers.get("x-amz-date", "")
    try:
        at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError("IncompleteSignature",
                             "the request needs an X-Amz-Date header (YYYYMMDDTHHMMSSZ)") from None
    return stamp, at


def verify(cred: Credential, secret: str, *, method: str, path: str, query: str,
           headers: Mapping[str, str], body: bytes, now: datetime,
           service: str = "sqs") -> None:
    """Raises SignatureError unless the request was signed with `secret` for `service`, within
    MAX_SKEW_S of `now`. Header names in `headers` are lower case."""
    if cred.service != service:
        raise SignatureError("InvalidClientTokenId",
                             f"the credential is scoped to service {cred.service!r}, not "
                             f"{service!r}")
    unsigned = sorted(h for h in MEANING_HEADERS if h in headers
                      and h not in cred.signed_headers)
    if unsigned:  # else a captured request could be replayed as another action
        raise SignatureError("IncompleteSignature",
                             f"{', '.join(unsigned)} must be signed (it says what the request "
                             "does); list it in SignedHeaders (SDKs do so themselves)")
    stamp, at = request_time(headers)
    if stamp[:8] != cred.date:
        raise SignatureError("SignatureDoesNotMatch",
                             "the credential date does not match X-Amz-Date")
    if abs((now - at).total_seconds()) > MAX_SKEW_S:
        raise SignatureError("RequestExpired",
                             "the request was signed more than 15 minutes away from the "
                             "server's clock; check the client's clock")
    body_sha256 = hashlib.sha256(body).hexdigest()
    claimed = headers.get("x-amz-content-sha256")
    # The body is always signed here (no UNSIGNED-PAYLOAD): a captured request cannot be
    # replayed with another body.
    if claimed is not None and claimed != body_sha256:
        raise SignatureError("SignatureDoesNotMatch",
                             "x-amz-content-sha256 does not match the body")
    creq = canonical_request(method, path, query, headers, cred.signed_headers, body_sha256)
    to_sign = "\n".join([ALGORITHM, stamp, cred.scope,
                         hashlib.sha256(creq.encode("utf-8")).hexdigest()])
    expected = hmac.new(signing_key(secret, cred.date, cred.region, cred.service),
                        to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, cred.signature):
        raise SignatureError("SignatureDoesNotMatch",
                             "the request signature does not match; check the secret access "
                             "key and that nothing rewrote the request on its way")
