-- tableq schema v1 for SQLite. Times are Unix epoch seconds (REAL) from the database clock.
-- The hot table holds only live messages (ready, scheduled, leased); finished rows move out.
CREATE TABLE {p}message (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused after delete
    topic TEXT NOT NULL,
    key TEXT,
    kind TEXT,
    payload TEXT,
    payload_bytes BLOB,
    headers TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    available_at REAL NOT NULL,  -- due time; while leased, the lease expiry
    first_available_at REAL NOT NULL,
    received_at REAL,
    lease TEXT,
    last_error TEXT,
    progress TEXT
);
-- NULL keys never collide, so this is "at most one live message per (topic, key)".
CREATE UNIQUE INDEX {p}message_topic_key ON {p}message (topic, key);
CREATE INDEX {p}message_claim ON {p}message (topic, priority DESC, available_at, id);

CREATE TABLE {p}dead (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    key TEXT,
    kind TEXT,
    payload TEXT,
    payload_bytes BLOB,
    headers TEXT,
    priority INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    created_at REAL NOT NULL,
    first_available_at REAL NOT NULL,
    received_at REAL,
    error TEXT,
    dead_at REAL NOT NULL
);
CREATE INDEX {p}dead_topic ON {p}dead (topic, id);

CREATE TABLE {p}done (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    key TEXT,
    kind TEXT,
    payload TEXT,
    payload_bytes BLOB,
    headers TEXT,
    priority INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    created_at REAL NOT NULL,
    first_available_at REAL NOT NULL,
    received_at REAL,
    done_at REAL NOT NULL,
    lease TEXT
);
CREATE INDEX {p}done_topic ON {p}done (topic, id);

CREATE TABLE {p}stage (
    sid INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    part INTEGER NOT NULL,
    topic TEXT NOT NULL,
    key TEXT,
    kind TEXT,
    payload TEXT,
    payload_bytes BLOB,
    headers TEXT,
    priority INTEGER NOT NULL,
    delay_s REAL NOT NULL,
    at REAL
);
CREATE INDEX {p}stage_job ON {p}stage (job, part);

CREATE TABLE {p}load_job (
    job TEXT PRIMARY KEY,
    state TEXT NOT NULL,  -- open | committed | aborted
    created_at REAL NOT NULL,
    finished_at REAL,
    rows INTEGER
);
