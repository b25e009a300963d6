-- Access tokens of the HTTP server (tableq serve) and its idempotency records. A token is
-- stored only as the SHA-256 of its secret; sqs_secret is kept as given because AWS
-- Signature V4 is an HMAC keyed by it, so the server must be able to recompute it.
CREATE TABLE {schema}.token (
    id text PRIMARY KEY,
    secret_sha256 text NOT NULL UNIQUE,
    role text NOT NULL,
    topics jsonb NOT NULL,  -- list of exact topic names or globs
    name text,
    access_key text UNIQUE,
    sqs_secret text,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    expires_at timestamptz,
    revoked_at timestamptz
);

-- The first response to a request with an Idempotency-Key, per token. Written in the same
-- transaction as the send it records, so a send and its record commit or vanish together.
CREATE TABLE {schema}.idempotency (
    token_id text NOT NULL,
    idem_key text NOT NULL,
    fingerprint text NOT NULL,
    status integer NOT NULL,
    response text,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (token_id, idem_key)
);
CREATE INDEX idempotency_created ON {schema}.idempotency (created_at);
