-- tableq schema v1 for MySQL >= 8.0 and MariaDB >= 10.6 ({p} is the table prefix, {bin} the
-- server's binary no-pad collation, so keys compare byte for byte as on the other backends).
-- IF NOT EXISTS everywhere: DDL commits implicitly here, so a migration must be rerunnable.
CREATE TABLE IF NOT EXISTS {p}message (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    topic VARCHAR(200) NOT NULL,
    `key` VARCHAR(255) NULL,
    kind VARCHAR(100) NULL,
    payload LONGTEXT NULL,
    payload_bytes LONGBLOB NULL,
    headers MEDIUMTEXT NULL,
    priority INT NOT NULL DEFAULT 0,
    attempts INT NOT NULL DEFAULT 0,
    created_at DATETIME(6) NOT NULL,
    available_at DATETIME(6) NOT NULL,  -- due time; while leased, the lease expiry
    first_available_at DATETIME(6) NOT NULL,
    received_at DATETIME(6) NULL,
    lease VARCHAR(200) NULL,
    last_error MEDIUMTEXT NULL,
    progress LONGTEXT NULL,
    -- NULL keys never collide: at most one live message per (topic, key).
    UNIQUE KEY {p}message_topic_key (topic, `key`),
    KEY {p}message_claim (topic, priority DESC, available_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};

CREATE TABLE IF NOT EXISTS {p}dead (
    id BIGINT NOT NULL PRIMARY KEY,
    topic VARCHAR(200) NOT NULL,
    `key` VARCHAR(255) NULL,
    kind VARCHAR(100) NULL,
    payload LONGTEXT NULL,
    payload_bytes LONGBLOB NULL,
    headers MEDIUMTEXT NULL,
    priority INT NOT NULL,
    attempts INT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    first_available_at DATETIME(6) NOT NULL,
    received_at DATETIME(6) NULL,
    error MEDIUMTEXT NULL,
    dead_at DATETIME(6) NOT NULL,
    KEY {p}dead_topic (topic, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};

CREATE TABLE IF NOT EXISTS {p}done (
    id BIGINT NOT NULL PRIMARY KEY,
    topic VARCHAR(200) NOT NULL,
    `key` VARCHAR(255) NULL,
    kind VARCHAR(100) NULL,
    payload LONGTEXT NULL,
    payload_bytes LONGBLOB NULL,
    headers MEDIUMTEXT NULL,
    priority INT NOT NULL,
    attempts INT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    first_available_at DATETIME(6) NOT NULL,
    received_at DATETIME(6) NULL,
    done_at DATETIME(6) NOT NULL,
    lease VARCHAR(200) NULL,
    KEY {p}done_topic (topic, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};

CREATE TABLE IF NOT EXISTS {p}stage (
    sid BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job VARCHAR(200) NOT NULL,
    part BIGINT NOT NULL,
    topic VARCHAR(200) NOT NULL,
    `key` VARCHAR(255) NULL,
    kind VARCHAR(100) NULL,
    payload LONGTEXT NULL,
    payload_bytes LONGBLOB NULL,
    headers MEDIUMTEXT NULL,
    priority INT NOT NULL,
    delay_s DOUBLE NOT NULL,
    at DATETIME(6) NULL,
    KEY {p}stage_job (job, part)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};

CREATE TABLE IF NOT EXISTS {p}load_job (
    job VARCHAR(200) NOT NULL PRIMARY KEY,
    state VARCHAR(20) NOT NULL,
    created_at DATETIME(6) NOT NULL,
    finished_at DATETIME(6) NULL,
    `rows` BIGINT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={bin};
