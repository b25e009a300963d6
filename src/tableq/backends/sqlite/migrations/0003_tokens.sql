-- Access tokens of the HTTP server (tableq serve) and its idempotency records. A token is
-- stored only as the SHA-256 of its secret; sqs_secret is kept as given because AWS
-- Signature V4 is an HMAC keyed by it, so the server must be able to recompute it.
CREATE TABLE {p}token (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    topics TEXT NOT NULL,  -- JSON list of exact topic names or globs
    name TEXT,
    access_key TEXT UNIQUE,
    sqs_secret TEXT,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL
);

-- The first response to a request with an Idempotency-Key, per token. Written in the same
-- transaction as the send it records, so a send and its record commit or vanish together.
CREATE TABLE {p}idempotency (
    token_id TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status INTEGER NOT NULL,
    response TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (token_id, idem_key)
);
CREATE INDEX {p}idempotency_created ON {p}idempotency (created_at);
