-- Access tokens of the HTTP server (tableq serve) and its idempotency records. A token is
-- stored only as the SHA-256 of its secret; sqs_secret is kept as given because AWS
-- Signature V4 is an HMAC keyed by it, so the server must be able to recompute it.
-- IF NOT EXISTS: DDL commits implicitly here, so a migration must be rerunnable.
CREATE TABLE IF NOT EXISTS {p}token (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    secret_sha256 CHAR(64) NOT NULL,
    role VARCHAR(20) NOT NULL,
    topics MEDIUMTEXT NOT NULL,  -- JSON list of exact topic names or globs
    name VARCHAR(200) NULL,
    access_key VARCHAR(64) NULL,
    sqs_secret VARCHAR(200) NULL,
    created_at DATETIME(6) NOT NULL,
    expires_at DATETIME(6) NULL,
    revoked_at DATETIME(6) NULL,
    UNIQUE KEY {p}token_secret (secret_sha256),
    UNIQUE KEY {p}token_access_key (access_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};

-- The first response to a request with an Idempotency-Key, per token. Written in the same
-- transaction as the send it records, so a send and its record commit or vanish together.
CREATE TABLE IF NOT EXISTS {p}idempotency (
    token_id VARCHAR(64) NOT NULL,
    idem_key VARCHAR(255) NOT NULL,
    fingerprint CHAR(64) NOT NULL,
    status INT NOT NULL,
    response LONGTEXT NULL,
    created_at DATETIME(6) NOT NULL,
    PRIMARY KEY (token_id, idem_key),
    KEY {p}idempotency_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};
