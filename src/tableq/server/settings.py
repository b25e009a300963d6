"""The server's limits and switches, one frozen value."""

from __future__ import annotations

from dataclasses import dataclass

from tableq.errors import InvalidArgument

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """`max_body_bytes` caps every request body (checked before it is read);
    `max_batch` the messages of one send; `max_receive` the messages of one receive;
    `max_wait_s` a long poll. `metrics_public` lets /metrics answer without a token.
    `sample_interval_s` is how often the dashboard's history is sampled. `secure_cookies`
    marks the dashboard cookie Secure (None: when the request came over https)."""

    max_body_bytes: int = MIB
    max_batch: int = 1000
    max_receive: int = 1000
    max_wait_s: float = 20.0
    metrics_public: bool = False
    sample_interval_s: float = 10.0
    history_s: float = 3600.0
    idempotency_ttl_s: float = 86400.0
    secure_cookies: bool | None = None
    dashboard_refresh_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_batch", "max_receive"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a whole number >= 1, not {value!r}")
        if not 0 <= self.max_wait_s <= 20:
            raise InvalidArgument("max_wait_s must be between 0 and 20 seconds")
        if not self.sample_interval_s > 0 or not self.history_s >= self.sample_interval_s:
            raise InvalidArgument("sample_interval_s must be > 0 and history_s >= it")
