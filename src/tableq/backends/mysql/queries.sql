-- tableq named queries for MySQL >= 8.0 and MariaDB >= 10.6 (PyMySQL %(name)s parameters;
-- {p} is the table prefix). Sessions run at READ COMMITTED: no gap locks on the ranges a claim
-- scans (the classic queue deadlock). Times are UTC_TIMESTAMP(6), which no session time zone
-- shifts (an outbox send runs on the caller's session).

-- name: server_version :one
SELECT VERSION() AS version, @@innodb_autoinc_lock_mode AS autoinc_lock_mode,
       @@auto_increment_increment AS id_step, @@global.max_allowed_packet AS packet_limit;

-- name: session_time_zone :exec
SET time_zone = '+00:00';

-- name: session_isolation :exec
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;

-- name: session_pack_limit :exec
-- message_due_packed's text may be as long as a packet (max_allowed_packet bounds it anyway).
SET SESSION group_concat_max_len = 4294967295;

-- name: idle_transaction_limit :exec
-- MariaDB only: a transaction left idle (a hung or cut-off exactly-once worker) is rolled
-- back after this many seconds, releasing its row locks.
SET SESSION idle_transaction_timeout = %(seconds)s;

-- name: savepoint_set :exec
-- A send of several statements on a caller's connection, inside the caller's transaction:
-- all of it or none of it stays there (SqlBackend._whole).
SAVEPOINT tableq_send;

-- name: savepoint_rollback :exec
ROLLBACK TO SAVEPOINT tableq_send;

-- name: savepoint_release :exec
RELEASE SAVEPOINT tableq_send;

-- name: migration_lock :one
-- Migrators in other processes wait here (DDL cannot be rolled back in MySQL).
SELECT GET_LOCK(CONCAT('tableq.migrate.', DATABASE(), '.', %(prefix)s), %(wait_s)s) AS got;

-- name: migration_unlock :exec
DO RELEASE_LOCK(CONCAT('tableq.migrate.', DATABASE(), '.', %(prefix)s));

-- name: migration_create :exec
CREATE TABLE IF NOT EXISTS {p}migration (
    version INT NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL, applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB;

-- name: migration_versions :many
SELECT version FROM {p}migration ORDER BY version;

-- name: migration_record :exec
INSERT INTO {p}migration (version, name, applied_at) VALUES (%(version)s, %(name)s, UTC_TIMESTAMP(6));

-- name: connection_database :one
-- Which database a connection reaches, to refuse a caller's connection= to another one (the
-- queue's tables are not qualified by database). Checked once per connection: a later
-- select_db() or `USE` on it is not seen (PyMySQL does not say; a check on every call would
-- cost a round trip).
SELECT DATABASE() AS `database`, @@hostname AS server, @@port AS port;

-- name: clock_now :one
SELECT UTC_TIMESTAMP(6) AS now;

-- name: test_clock_create :exec
-- Tests only (connect(test_clock=True)): the backend then reads "now" from this row instead
-- of UTC_TIMESTAMP(6), so the time stands still until a test moves it. Production queries
-- never name this table.
CREATE TABLE IF NOT EXISTS {p}test_clock (
    one TINYINT NOT NULL PRIMARY KEY, clock DATETIME(6) NOT NULL
) ENGINE=InnoDB;

-- name: test_clock_init :exec
INSERT IGNORE INTO {p}test_clock (one, clock) VALUES (1, UTC_TIMESTAMP(6));

-- name: test_clock_advance :exec
UPDATE {p}test_clock SET clock = clock + INTERVAL %(by_us)s MICROSECOND;

-- name: message_insert :exec
-- A batch in one statement: its rows travel as one JSON array parameter (MySQL has no array
-- parameters), [[topic, key, kind, payload text, payload bytes as hex, headers text,
-- priority, at, delay_us], ...], read in order by JSON_TABLE. An INSERT ... SELECT holds the
-- table's AUTO-INC lock to its end under innodb_autoinc_lock_mode <= 1, so the batch gets
-- consecutive ids from LAST_INSERT_ID(), in array order. Text columns are LONGTEXT so no
-- value is cut short here: the table's own column limits judge them, as for a VALUES row.
INSERT INTO {p}message (topic, `key`, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT r.topic, r.`key`, r.kind, r.payload, UNHEX(r.data), r.headers, r.priority,
       UTC_TIMESTAMP(6),
       GREATEST(COALESCE(r.at, UTC_TIMESTAMP(6) + INTERVAL r.delay_us MICROSECOND),
                UTC_TIMESTAMP(6)),
       COALESCE(r.at, UTC_TIMESTAMP(6) + INTERVAL r.delay_us MICROSECOND)
FROM JSON_TABLE(%(rows)s, '$[*]' COLUMNS (
    ord FOR ORDINALITY, topic LONGTEXT PATH '$[0]', `key` LONGTEXT PATH '$[1]',
    kind LONGTEXT PATH '$[2]', payload LONGTEXT PATH '$[3]', data LONGTEXT PATH '$[4]',
    headers LONGTEXT PATH '$[5]', priority INT PATH '$[6]', at DATETIME(6) PATH '$[7]',
    delay_us BIGINT PATH '$[8]')) AS r
ORDER BY r.ord;

-- name: message_insert_one :exec
-- One row as a VALUES list: a "simple insert" to InnoDB, which takes the AUTO-INC lock only
-- for the moment it hands out the id (message_insert's INSERT ... SELECT holds it to the
-- statement's end, so every other insert into the table would wait behind a single send).
INSERT INTO {p}message (topic, `key`, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
VALUES (%(topic)s, %(key)s, %(kind)s, %(payload)s, %(payload_bytes)s, %(headers)s, %(priority)s,
        UTC_TIMESTAMP(6),
        GREATEST(COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND),
                 UTC_TIMESTAMP(6)),
        COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND));

-- name: message_insert_ignore :exec
-- A duplicate key is ignored: LAST_INSERT_ID(id) hands back the existing row's id (rowcount
-- 0).
INSERT INTO {p}message (topic, `key`, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
VALUES (%(topic)s, %(key)s, %(kind)s, %(payload)s, %(payload_bytes)s, %(headers)s, %(priority)s,
        UTC_TIMESTAMP(6),
        GREATEST(COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND),
                 UTC_TIMESTAMP(6)),
        COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND))
ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);

-- name: message_insert_replace :exec
-- Replacing resets the delivery: a worker holding the old lease gets LeaseLost on ack.
INSERT INTO {p}message (topic, `key`, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
VALUES (%(topic)s, %(key)s, %(kind)s, %(payload)s, %(payload_bytes)s, %(headers)s, %(priority)s,
        UTC_TIMESTAMP(6),
        GREATEST(COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND),
                 UTC_TIMESTAMP(6)),
        COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND))
ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id), kind = VALUES(kind),
    payload = VALUES(payload), payload_bytes = VALUES(payload_bytes), headers = VALUES(headers),
    priority = VALUES(priority), attempts = 0, lease = NULL, last_error = NULL, progress = NULL,
    received_at = NULL, available_at = VALUES(available_at),
    first_available_at = VALUES(first_available_at);

-- name: message_find_key :one
SELECT id FROM {p}message WHERE topic = %(topic)s AND `key` = %(key)s;

-- name: message_due :many
-- SKIP LOCKED lets concurrent receivers pass over each other's rows instead of waiting.
-- Not the times and lease a claim replaces (PyMySQL decodes every column in Python: 3-5% of
-- a drain); a take reads them with message_taken.
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, last_error, progress, UTC_TIMESTAMP(6) AS db_now FROM {p}message
WHERE topic = %(topic)s AND available_at <= UTC_TIMESTAMP(6)
ORDER BY priority DESC, available_at, id
LIMIT %(max)s
FOR UPDATE SKIP LOCKED;

-- name: message_due_packed :one
-- message_due's rows packed by the server into one JSON text (C's json.loads reads it), for
-- the unfiltered claim: PyMySQL parses every column of every row in Python, about half the
-- client time of a claim of 1,000. n counts the rows locked: a text the session's
-- group_concat_max_len or max_allowed_packet cut short (huge payloads) does not parse, or is
-- NULL, and the claim reads the same locked rows again with message_due. Bytes payloads as
-- hex; the topic is the one asked for. GROUP_CONCAT, not JSON_ARRAYAGG: MySQL 8's takes no
-- ORDER BY.
SELECT COUNT(*) AS n, UTC_TIMESTAMP(6) AS db_now,
       CONCAT('[', GROUP_CONCAT(JSON_ARRAY(id, `key`, kind, payload, HEX(payload_bytes), headers,
                                           priority, attempts, created_at, first_available_at,
                                           last_error, progress)
                                ORDER BY priority DESC, available_at, id SEPARATOR ','),
              ']') AS packed
FROM (SELECT * FROM {p}message
      WHERE topic = %(topic)s AND available_at <= UTC_TIMESTAMP(6)
      ORDER BY priority DESC, available_at, id
      LIMIT %(max)s
      FOR UPDATE SKIP LOCKED) due;

-- name: message_due_where :many
-- message_due with the receive filter, all bound: kind and key (NULL: any), and the payload
-- fields as one JSON object, each compared by JSON type and value (1 = 1.0; "1" <> 1; true
-- <> 1; a missing field, a non-object or bytes payload has no field and matches none). Field
-- names passed a narrow grammar (letters, digits, _ and -), so each quoted path is exact.
-- Whole numbers compare as integers (exact to 64 bits), others as doubles.
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, last_error, progress, UTC_TIMESTAMP(6) AS db_now FROM {p}message
WHERE topic = %(topic)s AND available_at <= UTC_TIMESTAMP(6)
  AND (%(f_kind)s IS NULL OR kind = %(f_kind)s)
  AND (%(f_key)s IS NULL OR `key` = %(f_key)s)
  AND NOT EXISTS (
      SELECT 1
      FROM (SELECT k.path, JSON_TYPE(JSON_EXTRACT(%(f_fields)s, k.path)) AS type,
                   JSON_UNQUOTE(JSON_EXTRACT(%(f_fields)s, k.path)) AS text
            FROM (SELECT CONCAT('$."', j.name, '"') AS path
                  FROM JSON_TABLE(JSON_KEYS(%(f_fields)s), '$[*]'
                                  COLUMNS (name VARCHAR(64) PATH '$')) AS j) AS k) AS f
      WHERE NOT COALESCE(CASE f.type
          WHEN 'NULL' THEN JSON_TYPE(JSON_EXTRACT(payload, f.path)) = 'NULL'
          WHEN 'STRING' THEN JSON_TYPE(JSON_EXTRACT(payload, f.path)) = 'STRING'
               -- as bytes: JSON_UNQUOTE's collation pads, so "a" would equal "a "
               AND CAST(JSON_UNQUOTE(JSON_EXTRACT(payload, f.path)) AS BINARY)
                   = CAST(f.text AS BINARY)
          WHEN 'BOOLEAN' THEN JSON_TYPE(JSON_EXTRACT(payload, f.path)) = 'BOOLEAN'
               AND JSON_UNQUOTE(JSON_EXTRACT(payload, f.path)) = f.text
          WHEN 'INTEGER' THEN JSON_TYPE(JSON_EXTRACT(payload, f.path))
                   IN ('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL')
               -- MariaDB's JSON_TYPE calls 1e+16 and 1e-07 INTEGER too, and CAST reads both
               -- as 1: only digits are read as an integer, the rest as a double.
               AND CASE WHEN f.text REGEXP '^-?[0-9]+$'
                        THEN JSON_EXTRACT(payload, f.path) = CAST(f.text AS SIGNED)
                        ELSE JSON_EXTRACT(payload, f.path) = f.text + 0e0 END
          ELSE JSON_TYPE(JSON_EXTRACT(payload, f.path))
                   IN ('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL')
               AND JSON_EXTRACT(payload, f.path) = f.text + 0e0
      END, FALSE))
ORDER BY priority DESC, available_at, id
LIMIT %(max)s
FOR UPDATE SKIP LOCKED;

-- name: message_taken :many
-- What message_due leaves out, for a take (it returns the rows as they were). Rows locked.
SELECT id, available_at, received_at, lease FROM {p}message WHERE id IN %(ids)s;

-- name: message_lease :exec
-- Only the ids in `charged` are charged an attempt now (a worker charges its prefetched
-- messages later, when their handlers start).
UPDATE {p}message
SET lease = %(lease)s, attempts = attempts + (id IN %(charged)s), received_at = %(now)s,
    available_at = %(until)s
WHERE id IN %(ids)s;

-- name: message_charge :exec
-- A worker's prefetched message, charged its attempt as its handler starts; the lease is
-- extended in the same statement, so the handler starts on a full, confirmed lease. Only a
-- delivery still at the count it was received with is charged, so a charge retried after its
-- COMMIT's reply was lost counts once (message_charged then reads it as charged).
-- `id IN` first: MariaDB updates through a one-tuple row constructor by scanning the whole
-- primary key (about 16 ms at 20k rows, for one message); the id list gives it the range.
UPDATE {p}message
SET attempts = attempts + 1, available_at = UTC_TIMESTAMP(6) + INTERVAL %(extend_us)s MICROSECOND
WHERE id IN %(ids)s AND (id, lease, attempts) IN %(charges)s;

-- name: message_charged :many
SELECT id, attempts, available_at FROM {p}message WHERE (id, lease) IN %(refs)s;

-- name: message_dead_letter_ids :exec
INSERT INTO {p}dead (id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, error, dead_at)
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at,
       COALESCE(last_error, CONCAT('received ', attempts, ' times without an ack')), UTC_TIMESTAMP(6)
FROM {p}message WHERE id IN %(ids)s;

-- name: message_delete_ids :exec
DELETE FROM {p}message WHERE id IN %(ids)s;

-- name: message_held :many
-- Which of these deliveries still hold their lease; locks them until the transaction ends.
SELECT id FROM {p}message WHERE (id, lease) IN %(refs)s FOR UPDATE;

-- name: done_insert :exec
-- Run on rows already locked (FOR UPDATE): they cannot change between this copy and the delete.
INSERT INTO {p}done (id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, done_at, lease)
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, UTC_TIMESTAMP(6), lease
FROM {p}message WHERE id IN %(ids)s;

-- name: message_ack_one :exec
DELETE FROM {p}message WHERE id = %(id)s AND lease = %(lease)s;

-- name: message_ack_held :exec
-- A batch ack in one statement; the backend rolls it back unless it deleted every ref (then
-- message_held finds which are still held). `id IN` first, as in message_charge.
DELETE FROM {p}message WHERE id IN %(ids)s AND (id, lease) IN %(refs)s;

-- name: message_ack_lease :exec
-- message_ack_held when every ref holds one lease (a receive call's token: a worker's batch
-- of acks mostly does): a DELETE of 1,000 took 4.9 ms this way and 7.7 ms by (id, lease)
-- pairs (the shared server, medians of 24); one statement either way.
DELETE FROM {p}message WHERE id IN %(ids)s AND lease = %(lease)s;

-- name: message_release :exec
UPDATE {p}message
SET lease = NULL, attempts = attempts - %(refund)s,
    available_at = UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND,
    last_error = COALESCE(%(error)s, last_error)
WHERE id = %(id)s AND lease = %(lease)s;

-- name: message_extend :exec
UPDATE {p}message
SET available_at = UTC_TIMESTAMP(6) + INTERVAL %(extend_us)s MICROSECOND,
    progress = COALESCE(%(progress)s, progress)
WHERE id = %(id)s AND lease = %(lease)s;

-- name: message_lease_until :one
SELECT available_at FROM {p}message WHERE id = %(id)s AND lease = %(lease)s;

-- name: message_extend_many :exec
UPDATE {p}message SET available_at = UTC_TIMESTAMP(6) + INTERVAL %(extend_us)s MICROSECOND
WHERE id IN %(ids)s;

-- name: message_due_at :many
SELECT id, available_at FROM {p}message WHERE id IN %(ids)s;

-- name: message_lock_leased :one
-- Locks the row while it is still held under this lease, so what follows is fenced.
SELECT id FROM {p}message WHERE id = %(id)s AND lease = %(lease)s FOR UPDATE;

-- name: lease_lock :many
SELECT id FROM {p}message WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s FOR UPDATE;

-- name: done_match :many
-- Acks whose earlier attempt committed (its reply was lost): the done table still has them.
SELECT id FROM {p}done WHERE (id, lease) IN %(refs)s;

-- name: dead_insert :exec
INSERT INTO {p}dead (id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, error, dead_at)
VALUES (%(id)s, %(topic)s, %(key)s, %(kind)s, %(payload)s, %(payload_bytes)s, %(headers)s,
        %(priority)s, %(attempts)s, %(created_at)s, %(first_available_at)s, %(received_at)s,
        %(error)s, UTC_TIMESTAMP(6));

-- name: message_dead_letter :exec
INSERT INTO {p}dead (id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, error, dead_at)
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, %(error)s, UTC_TIMESTAMP(6)
FROM {p}message WHERE id = %(id)s AND lease = %(lease)s;

-- name: message_peek :many
SELECT * FROM {p}message WHERE topic = %(topic)s
ORDER BY priority DESC, available_at, id LIMIT %(limit)s;

-- name: message_get :one
SELECT * FROM {p}message WHERE id = %(id)s;

-- name: message_topics :many
SELECT topic FROM {p}message UNION SELECT topic FROM {p}dead ORDER BY 1;

-- name: message_stats :many
SELECT topic,
       SUM(available_at <= t.now) AS ready,
       SUM(available_at > t.now AND lease IS NULL) AS scheduled,
       SUM(available_at > t.now AND lease IS NOT NULL) AS in_flight,
       TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN available_at <= t.now THEN available_at END),
                     t.now) / 1e6 AS oldest_ready_age
FROM {p}message, (SELECT UTC_TIMESTAMP(6) AS now) t
WHERE (%(topic)s IS NULL OR topic = %(topic)s)
GROUP BY topic, t.now;

-- name: message_stats_topic :many
-- One topic, counted through the claim index (stats() of the small topics of a big table).
SELECT topic,
       SUM(available_at <= t.now) AS ready,
       SUM(available_at > t.now AND lease IS NULL) AS scheduled,
       SUM(available_at > t.now AND lease IS NOT NULL) AS in_flight,
       TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN available_at <= t.now THEN available_at END),
                     t.now) / 1e6 AS oldest_ready_age
FROM {p}message, (SELECT UTC_TIMESTAMP(6) AS now) t
WHERE topic = %(topic)s
GROUP BY topic, t.now;

-- name: message_id_span :one
SELECT MIN(id) AS lo, MAX(id) AS hi FROM {p}message;

-- name: message_stats_sample :many
-- The rows of evenly spread id windows (primary key ranges), counted as message_stats does;
-- the caller scales the counts up by stride / width.
WITH RECURSIVE w(lo) AS (
    SELECT CAST(%(lo)s AS SIGNED)
    UNION ALL
    SELECT lo + %(stride)s FROM w WHERE lo + %(stride)s <= %(hi)s
)
SELECT m.topic,
       SUM(m.available_at <= t.now) AS ready,
       SUM(m.available_at > t.now AND m.lease IS NULL) AS scheduled,
       SUM(m.available_at > t.now AND m.lease IS NOT NULL) AS in_flight,
       COUNT(DISTINCT w.lo) AS windows
FROM w STRAIGHT_JOIN {p}message m FORCE INDEX (PRIMARY)
         ON m.id >= w.lo AND m.id < w.lo + %(width)s,
     (SELECT UTC_TIMESTAMP(6) AS now) t
WHERE (%(topic)s IS NULL OR m.topic = %(topic)s)
GROUP BY m.topic, t.now;

-- name: message_topic_after :one
-- The next live topic after `after`, one claim-index probe (stats() walks the topics so).
SELECT topic FROM {p}message WHERE topic > %(after)s ORDER BY topic LIMIT 1;

-- name: message_priority_at_most :one
-- A topic's highest priority at or below `at_most`, one claim-index probe.
SELECT priority FROM {p}message WHERE topic = %(topic)s AND priority <= %(at_most)s
ORDER BY priority DESC LIMIT 1;

-- name: message_priority_head :one
-- One priority of a topic from the claim index: the age of its oldest ready message (the
-- first entry), and its scheduled and leased messages (the entries after now), counted up to
-- `cap` each.
SELECT TIMESTAMPDIFF(MICROSECOND, (
           SELECT available_at FROM {p}message
           WHERE topic = %(topic)s AND priority = %(priority)s AND available_at <= t.now
           ORDER BY available_at LIMIT 1), t.now) / 1e6 AS oldest_ready_age,
       (SELECT COUNT(*) FROM (
           SELECT 1 FROM {p}message
           WHERE topic = %(topic)s AND priority = %(priority)s
             AND available_at > UTC_TIMESTAMP(6) AND lease IS NULL
           LIMIT %(cap)s) x) AS scheduled,
       (SELECT COUNT(*) FROM (
           SELECT 1 FROM {p}message
           WHERE topic = %(topic)s AND priority = %(priority)s
             AND available_at > UTC_TIMESTAMP(6) AND lease IS NOT NULL
           LIMIT %(cap)s) x) AS in_flight
FROM (SELECT UTC_TIMESTAMP(6) AS now) t;

-- name: dead_stats :many
SELECT topic, COUNT(*) AS dead FROM {p}dead WHERE (%(topic)s IS NULL OR topic = %(topic)s)
GROUP BY topic;

-- name: done_stats :many
SELECT topic, COUNT(*) AS done FROM {p}done WHERE (%(topic)s IS NULL OR topic = %(topic)s)
GROUP BY topic;

-- name: message_purge :exec
DELETE FROM {p}message WHERE topic = %(topic)s;

-- name: dead_list :many
SELECT * FROM {p}dead WHERE topic = %(topic)s ORDER BY id LIMIT %(limit)s;

-- name: dead_requeue_ids :many
SELECT d.id, d.`key` FROM {p}dead d
WHERE d.topic = %(topic)s AND (%(all)s OR d.id IN %(ids)s)
  AND (d.`key` IS NULL OR NOT EXISTS (
      SELECT 1 FROM {p}message m WHERE m.topic = d.topic AND m.`key` = d.`key`))
ORDER BY d.id
FOR UPDATE;

-- name: dead_requeue :exec
-- Back as a fresh message with the same id.
INSERT INTO {p}message (id, topic, `key`, kind, payload, payload_bytes, headers, priority,
                        attempts, created_at, available_at, first_available_at, last_error)
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, 0, created_at,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), error
FROM {p}dead WHERE id IN %(ids)s ORDER BY id;

-- name: dead_delete_requeued :exec
-- The dead letters that dead_requeue moved back (by id).
DELETE FROM {p}dead WHERE id IN %(ids)s;

-- name: dead_purge :exec
DELETE FROM {p}dead WHERE topic = %(topic)s AND (%(all)s OR id IN %(ids)s);

-- name: lease_rows :many
-- A group lease is found by its id range, not by scanning the topic; one of n readers
-- takes the ids with id mod n = k.
SELECT * FROM {p}message WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s AND MOD(id, %(n)s) = %(k)s
ORDER BY priority DESC, id;

-- name: lease_read :many
-- lease_rows for a reader that passes the rows on as they are (the Spark source): the JSON
-- columns are text here already.
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       available_at, first_available_at, received_at, lease
FROM {p}message WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s AND MOD(id, %(n)s) = %(k)s
ORDER BY priority DESC, id;

-- name: done_insert_lease :exec
-- Run on rows already locked (lease_lock): they cannot change between this copy and the delete.
INSERT INTO {p}done (id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, done_at, lease)
SELECT id, topic, `key`, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, UTC_TIMESTAMP(6), lease
FROM {p}message WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s;

-- name: lease_ack :exec
DELETE FROM {p}message WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s;

-- name: lease_extend :exec
UPDATE {p}message SET available_at = UTC_TIMESTAMP(6) + INTERVAL %(extend_us)s MICROSECOND
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s;

-- name: lease_extend_ending :exec
-- lease_extend of the leases that end within within_us only: a lease taken a moment ago is
-- not rewritten.
UPDATE {p}message SET available_at = UTC_TIMESTAMP(6) + INTERVAL %(extend_us)s MICROSECOND
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s
  AND available_at < UTC_TIMESTAMP(6) + INTERVAL %(within_us)s MICROSECOND;

-- name: lease_release :exec
-- A group lease given back unread (the stream source's batch leased ahead of Spark): due now,
-- its lease cleared (its token may be used again) and the attempt its claim charged refunded.
UPDATE {p}message
SET lease = NULL, attempts = GREATEST(attempts - 1, 0), available_at = UTC_TIMESTAMP(6)
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s;

-- name: stage_insert :exec
INSERT INTO {p}stage (job, part, topic, `key`, kind, payload, payload_bytes, headers, priority,
                      delay_s, at)
VALUES (%(job)s, %(part)s, %(topic)s, %(key)s, %(kind)s, %(payload)s, %(payload_bytes)s,
        %(headers)s, %(priority)s, %(delay_s)s, %(at)s);

-- name: load_job_open :exec
INSERT INTO {p}load_job (job, state, created_at) VALUES (%(job)s, 'open', UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE job = job;

-- name: load_job_lock :one
SELECT state FROM {p}load_job WHERE job = %(job)s FOR UPDATE;

-- name: load_job_reopen :exec
-- A job id reused after an abort starts afresh.
UPDATE {p}load_job SET state = 'open', created_at = UTC_TIMESTAMP(6), finished_at = NULL
WHERE job = %(job)s AND state = 'aborted';

-- name: load_job_share :one
-- Held by every staging transaction, so a commit (which locks the row exclusively) waits for
-- the writers in flight, and a writer arriving after the commit sees it and writes nothing.
SELECT state FROM {p}load_job WHERE job = %(job)s LOCK IN SHARE MODE;

-- name: load_job_state :one
SELECT state FROM {p}load_job WHERE job = %(job)s;

-- name: load_job_finish :exec
UPDATE {p}load_job SET state = %(state)s, finished_at = UTC_TIMESTAMP(6), `rows` = %(rows)s
WHERE job = %(job)s;

-- name: stage_publish :exec
-- A staged row whose key is already live is dropped (id = id changes nothing).
INSERT INTO {p}message (topic, `key`, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT topic, `key`, kind, payload, payload_bytes, headers, priority, UTC_TIMESTAMP(6),
       GREATEST(COALESCE(at, UTC_TIMESTAMP(6) + INTERVAL ROUND(delay_s * 1000000) MICROSECOND),
                UTC_TIMESTAMP(6)),
       COALESCE(at, UTC_TIMESTAMP(6) + INTERVAL ROUND(delay_s * 1000000) MICROSECOND)
FROM {p}stage WHERE job = %(job)s AND part IN %(parts)s ORDER BY sid
ON DUPLICATE KEY UPDATE id = id;

-- name: stage_publish_replace :exec
INSERT INTO {p}message (topic, `key`, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT topic, `key`, kind, payload, payload_bytes, headers, priority, UTC_TIMESTAMP(6),
       GREATEST(COALESCE(at, UTC_TIMESTAMP(6) + INTERVAL ROUND(delay_s * 1000000) MICROSECOND),
                UTC_TIMESTAMP(6)),
       COALESCE(at, UTC_TIMESTAMP(6) + INTERVAL ROUND(delay_s * 1000000) MICROSECOND)
FROM {p}stage WHERE job = %(job)s AND part IN %(parts)s ORDER BY sid
ON DUPLICATE KEY UPDATE kind = VALUES(kind), payload = VALUES(payload),
    payload_bytes = VALUES(payload_bytes), headers = VALUES(headers),
    priority = VALUES(priority), attempts = 0, lease = NULL, last_error = NULL,
    progress = NULL, received_at = NULL, available_at = VALUES(available_at),
    first_available_at = VALUES(first_available_at);

-- name: stage_count :one
SELECT COUNT(*) AS n FROM {p}stage WHERE job = %(job)s AND part IN %(parts)s;

-- name: stage_delete_job :exec
DELETE FROM {p}stage WHERE job = %(job)s;

-- name: stage_stale_jobs :many
SELECT job FROM {p}load_job
WHERE state = 'open' AND created_at <= UTC_TIMESTAMP(6) - INTERVAL %(older_than_us)s MICROSECOND;

-- name: history_bounds_live :one
SELECT MIN(id) AS lo, MAX(id) AS hi FROM {p}message WHERE (%(topic)s IS NULL OR topic = %(topic)s);

-- name: history_rows_live :many
-- Live messages by id range, for snapshots (the lease column is left to the caller).
SELECT * FROM {p}message
WHERE id BETWEEN %(lo)s AND %(hi)s AND (%(topic)s IS NULL OR topic = %(topic)s)
  AND (%(before)s IS NULL OR created_at < %(before)s)
ORDER BY id;

-- name: history_bounds_dead :one
SELECT MIN(id) AS lo, MAX(id) AS hi FROM {p}dead WHERE (%(topic)s IS NULL OR topic = %(topic)s);

-- name: history_bounds_done :one
SELECT MIN(id) AS lo, MAX(id) AS hi FROM {p}done WHERE (%(topic)s IS NULL OR topic = %(topic)s);

-- name: history_rows_dead :many
SELECT * FROM {p}dead
WHERE id BETWEEN %(lo)s AND %(hi)s AND (%(topic)s IS NULL OR topic = %(topic)s)
  AND (%(before)s IS NULL OR dead_at < %(before)s)
ORDER BY id;

-- name: history_rows_done :many
SELECT * FROM {p}done
WHERE id BETWEEN %(lo)s AND %(hi)s AND (%(topic)s IS NULL OR topic = %(topic)s)
  AND (%(before)s IS NULL OR done_at < %(before)s)
ORDER BY id;

-- name: history_delete_dead :exec
DELETE FROM {p}dead WHERE id IN %(ids)s
  AND (%(before)s IS NULL OR dead_at < %(before)s);

-- name: history_delete_done :exec
DELETE FROM {p}done WHERE id IN %(ids)s
  AND (%(before)s IS NULL OR done_at < %(before)s);

-- --- tableq doctor: read-only facts about the server (judged in tableq.doctor) ---------------

-- name: doctor_durability :one
-- What decides whether a commit that was acknowledged survives a crash of the server or of
-- the machine, and whether the binary log (replicas, point-in-time recovery) agrees with it.
SELECT @@innodb_flush_log_at_trx_commit AS innodb_flush_log_at_trx_commit,
       @@sync_binlog AS sync_binlog, @@log_bin AS log_bin, @@binlog_format AS binlog_format;

-- name: doctor_old_transactions :many
-- Open InnoDB transactions, oldest first (this session left out): while a read view lasts,
-- purge keeps every row version deleted after it began. Needs the PROCESS privilege. InnoDB
-- refreshes this table only after 0.1 s without a read of it; one read per report is fine.
-- trx_started has whole seconds, so an age may read up to 1 s high.
SELECT t.trx_mysql_thread_id AS pid, p.USER AS user_name, p.HOST AS client,
       t.trx_state AS state,
       TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6 AS age_s
FROM information_schema.INNODB_TRX AS t
LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_mysql_thread_id <> CONNECTION_ID()
ORDER BY t.trx_started
LIMIT 5;

-- name: doctor_history_length :one
-- Undo records purge has not yet removed: grows while an old read view lasts.
SELECT `COUNT` AS history_length
FROM information_schema.INNODB_METRICS
WHERE NAME = 'trx_rseg_history_len';

-- name: doctor_size :one
-- The message table's space in its tablespace (statistics: DATA_LENGTH and INDEX_LENGTH may
-- lag until InnoDB recalculates them; DATA_FREE, the free extents, is read live). DATA_FREE is
-- the table's own only in a file of its own (innodb_file_per_table, on by default: the
-- setting now, not necessarily when the table was made). No row while the table does not
-- exist.
SELECT DATA_LENGTH AS data_bytes, INDEX_LENGTH AS index_bytes, DATA_FREE AS free_bytes,
       TABLE_ROWS AS live_rows, @@innodb_file_per_table AS file_per_table
FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{p}message';

-- --- access tokens and idempotency records of the HTTP server ------------------------------

-- name: token_insert :exec
INSERT INTO {p}token (id, secret_sha256, role, topics, name, access_key, sqs_secret,
                      created_at, expires_at)
VALUES (%(id)s, %(secret_sha256)s, %(role)s, %(topics)s, %(name)s, %(access_key)s,
        %(sqs_secret)s, UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6) + INTERVAL %(expires_in_us)s MICROSECOND);

-- name: token_by_secret :one
SELECT *, UTC_TIMESTAMP(6) AS db_now FROM {p}token WHERE secret_sha256 = %(secret_sha256)s;

-- name: token_by_access_key :one
SELECT *, UTC_TIMESTAMP(6) AS db_now FROM {p}token WHERE access_key = %(access_key)s;

-- name: token_list :many
SELECT *, UTC_TIMESTAMP(6) AS db_now FROM {p}token ORDER BY created_at, id;

-- name: token_revoke :exec
UPDATE {p}token SET revoked_at = UTC_TIMESTAMP(6) WHERE id = %(id)s AND revoked_at IS NULL;

-- name: idempotency_claim :exec
-- Inside the send's transaction: a concurrent request with the same key waits on the row lock
-- until this transaction ends. Affected rows: 1 inserted, 0 already there (no-op update).
INSERT INTO {p}idempotency (token_id, idem_key, fingerprint, status, created_at)
VALUES (%(token_id)s, %(idem_key)s, %(fingerprint)s, 0, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE token_id = token_id;

-- name: idempotency_get :one
SELECT fingerprint, status, response FROM {p}idempotency
WHERE token_id = %(token_id)s AND idem_key = %(idem_key)s;

-- name: idempotency_finish :exec
UPDATE {p}idempotency SET status = %(status)s, response = %(response)s
WHERE token_id = %(token_id)s AND idem_key = %(idem_key)s;

-- name: idempotency_expire :exec
DELETE FROM {p}idempotency
WHERE created_at < UTC_TIMESTAMP(6) - INTERVAL %(older_than_us)s MICROSECOND;
