-- tableq named queries for SQLite (named parameters :name; {p} is the table prefix).
-- "now" is (julianday('now') - 2440587.5) * 86400.0: Unix seconds from SQLite's clock,
-- stable within one statement.
-- No SKIP LOCKED: SQLite has one writer at a time, and every writing transaction here starts
-- with BEGIN IMMEDIATE, so nobody else holds these rows.

-- name: session_journal_wal :exec
-- Every connection, as it opens: readers do not block the writer, nor the writer readers.
PRAGMA journal_mode=WAL;

-- name: session_synchronous_full :exec
-- PRAGMA takes no parameters, so each allowed synchronous= level is its own query.
PRAGMA synchronous=FULL;

-- name: session_synchronous_normal :exec
PRAGMA synchronous=NORMAL;

-- name: session_synchronous_extra :exec
PRAGMA synchronous=EXTRA;

-- name: session_data_version :one
-- Changes whenever another connection (in any process) commits: the listener's wake-up.
PRAGMA data_version;

-- name: tx_begin_write :exec
-- Takes the write lock up front: a deferred transaction that reads and then writes can fail
-- at once with SQLITE_BUSY_SNAPSHOT, without waiting for busy_timeout.
BEGIN IMMEDIATE;

-- name: tx_begin_read :exec
BEGIN;

-- name: tx_commit :exec
COMMIT;

-- name: tx_rollback :exec
ROLLBACK;

-- name: savepoint_set :exec
-- A send of several statements on a caller's connection, inside the caller's transaction:
-- all of it or none of it stays there (SqlBackend._whole).
SAVEPOINT tableq_send;

-- name: savepoint_rollback :exec
ROLLBACK TO SAVEPOINT tableq_send;

-- name: savepoint_release :exec
RELEASE SAVEPOINT tableq_send;

-- name: migration_create :exec
CREATE TABLE IF NOT EXISTS {p}migration (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL
);

-- name: migration_versions :many
SELECT version FROM {p}migration ORDER BY version;

-- name: migration_record :exec
INSERT INTO {p}migration (version, name, applied_at)
VALUES (:version, :name, (julianday('now') - 2440587.5) * 86400.0);

-- name: connection_database :one
-- Which file a connection reaches, to refuse a caller's connection= to another one. The
-- first row is always `main` (seq 0); the pragma costs a third of pragma_database_list's
-- table-valued form, and it runs on every call with a caller's plain sqlite3 connection.
PRAGMA database_list;

-- name: clock_now :one
SELECT (julianday('now') - 2440587.5) * 86400.0 AS now;

-- name: test_clock_create :exec
-- Tests only (connect(test_clock=True)): the backend then reads "now" from this row instead
-- of SQLite's clock, so the time stands still until a test moves it. Production queries
-- never name this table.
CREATE TABLE IF NOT EXISTS {p}test_clock (one INTEGER PRIMARY KEY CHECK (one = 1), clock REAL NOT NULL);

-- name: test_clock_init :exec
INSERT OR IGNORE INTO {p}test_clock (one, clock) VALUES (1, (julianday('now') - 2440587.5) * 86400.0);

-- name: test_clock_advance :exec
UPDATE {p}test_clock SET clock = clock + :by_s;

-- name: last_insert_id :one
SELECT last_insert_rowid() AS id;

-- name: message_insert :exec
INSERT INTO {p}message (topic, key, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT :topic, :key, :kind, :payload, :payload_bytes, :headers, :priority, t.now,
       max(COALESCE(:at, t.now + :delay_s), t.now), COALESCE(:at, t.now + :delay_s)
FROM (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t;

-- name: message_insert_many :exec
-- A batch of unkeyed text payloads in one statement: the rows travel as one JSON array,
-- [[topic, kind, payload text, headers text, priority, at, delay_s], ...], inserted in array
-- order. The connection holds the write lock, so they get consecutive ids. One statement
-- instead of one per row (executemany) also writes sqlite_sequence once, not per row: about
-- 5x faster for 1,000 rows. (Bytes payloads use message_insert: SQLite before 3.41 cannot
-- decode hex.)
INSERT INTO {p}message (topic, kind, payload, headers, priority,
                        created_at, available_at, first_available_at)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, r.value ->> 4, t.now,
       max(COALESCE(r.value ->> 5, t.now + (r.value ->> 6)), t.now),
       COALESCE(r.value ->> 5, t.now + (r.value ->> 6))
FROM json_each(:rows) r, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
ORDER BY r.key;

-- name: message_insert_payloads :exec
-- send_many's bare payloads under one template (topic, kind, headers, priority, due time):
-- only the payload texts travel, as one JSON array, inserted in array order with
-- consecutive ids (the connection holds the write lock). About 3x message_insert_many,
-- which reads seven fields out of each row's own array.
INSERT INTO {p}message (topic, kind, payload, headers, priority,
                        created_at, available_at, first_available_at)
SELECT :topic, :kind, p.value, :headers, :priority, t.now,
       max(COALESCE(:at, t.now + :delay_s), t.now), COALESCE(:at, t.now + :delay_s)
FROM json_each(:payloads) p, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
ORDER BY p.key;

-- name: message_find_key :one
SELECT id FROM {p}message WHERE topic = :topic AND key = :key;

-- name: message_insert_replace :exec
-- Replacing resets the delivery: a worker holding the old lease gets LeaseLost on ack.
-- (WHERE true: SQLite's parser needs it before ON CONFLICT after a SELECT.)
INSERT INTO {p}message (topic, key, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT :topic, :key, :kind, :payload, :payload_bytes, :headers, :priority, t.now,
       max(COALESCE(:at, t.now + :delay_s), t.now), COALESCE(:at, t.now + :delay_s)
FROM (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE true
ON CONFLICT (topic, key) WHERE key IS NOT NULL DO UPDATE SET
    kind = excluded.kind, payload = excluded.payload, payload_bytes = excluded.payload_bytes,
    headers = excluded.headers, priority = excluded.priority, attempts = 0, lease = NULL,
    last_error = NULL, progress = NULL, received_at = NULL,
    available_at = excluded.available_at, first_available_at = excluded.first_available_at;

-- name: message_due :many
SELECT id, attempts FROM {p}message
WHERE topic = :topic AND available_at <= (julianday('now') - 2440587.5) * 86400.0
ORDER BY priority DESC, available_at, id
LIMIT :max;

-- name: message_due_where :many
-- message_due with the receive filter, all bound: kind and key (NULL: any), and the payload
-- fields as one JSON object, each compared by JSON type and value (1 = 1.0; "1" <> 1; true
-- <> 1; a missing field, a non-object or bytes payload has no field and matches none). Field
-- names passed a narrow grammar (letters, digits, _ and -), so each quoted path is exact.
SELECT id, attempts FROM {p}message
WHERE topic = :topic AND available_at <= (julianday('now') - 2440587.5) * 86400.0
  AND (:f_kind IS NULL OR kind = :f_kind)
  AND (:f_key IS NULL OR key = :f_key)
  AND NOT EXISTS (
      SELECT 1 FROM (SELECT '$."' || key || '"' AS path, type, value FROM json_each(:f_fields)) f
      WHERE NOT COALESCE(CASE
          WHEN f.type IN ('null', 'true', 'false') THEN json_type(payload, f.path) = f.type
          WHEN f.type = 'text' THEN json_type(payload, f.path) = 'text'
               AND payload ->> f.path = f.value
          ELSE json_type(payload, f.path) IN ('integer', 'real') AND payload ->> f.path = f.value
      END, 0))
ORDER BY priority DESC, available_at, id
LIMIT :max;

-- name: message_lease :many
-- Only the ids in :charged are charged an attempt now (a worker charges its prefetched
-- messages later, when their handlers start).
UPDATE {p}message
SET lease = COALESCE(:lease, lower(hex(randomblob(16)))),
    attempts = attempts + (id IN (SELECT value FROM json_each(:charged))),
    received_at = (julianday('now') - 2440587.5) * 86400.0,
    available_at = (julianday('now') - 2440587.5) * 86400.0 + :vt
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING *;

-- name: message_take :many
DELETE FROM {p}message WHERE id IN (SELECT value FROM json_each(:ids)) RETURNING *;

-- name: message_dead_letter_ids :exec
INSERT INTO {p}dead (id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, error, dead_at)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at,
       COALESCE(last_error, 'received ' || attempts || ' times without an ack'),
       (julianday('now') - 2440587.5) * 86400.0
FROM {p}message WHERE id IN (SELECT value FROM json_each(:ids));

-- name: message_delete_ids :exec
DELETE FROM {p}message WHERE id IN (SELECT value FROM json_each(:ids));

-- name: done_insert :exec
-- refs is a JSON array of [id, lease] pairs.
INSERT INTO {p}done (id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, done_at, lease)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, (julianday('now') - 2440587.5) * 86400.0, lease
FROM {p}message
WHERE (id, lease) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:refs));

-- name: message_ack :many
-- Fenced on (id, lease): a stale lease matches nothing and changes nothing.
DELETE FROM {p}message
WHERE (id, lease) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:refs))
RETURNING id;

-- name: message_release :one
UPDATE {p}message
SET lease = NULL, attempts = attempts - :refund,
    available_at = (julianday('now') - 2440587.5) * 86400.0 + :delay_s,
    last_error = COALESCE(:error, last_error)
WHERE id = :id AND lease = :lease
RETURNING id;

-- name: message_extend :one
UPDATE {p}message
SET available_at = (julianday('now') - 2440587.5) * 86400.0 + :extend_s,
    progress = COALESCE(:progress, progress)
WHERE id = :id AND lease = :lease
RETURNING available_at;

-- name: message_charge :many
-- A worker's prefetched message, charged its attempt as its handler starts; the lease is
-- extended in the same statement, so the handler starts on a full, confirmed lease. The
-- count is set to one more than the delivery was received with, never added to, so a charge
-- retried after its COMMIT's reply was lost counts once.
UPDATE {p}message
SET attempts = MAX({p}message.attempts, a.attempts + 1),
    available_at = (julianday('now') - 2440587.5) * 86400.0 + :extend_s
FROM (SELECT value ->> 0 AS id, value ->> 1 AS lease, value ->> 2 AS attempts
      FROM json_each(:refs)) AS a
WHERE {p}message.id = a.id AND {p}message.lease = a.lease
RETURNING id, attempts, available_at;

-- name: message_extend_many :many
UPDATE {p}message SET available_at = (julianday('now') - 2440587.5) * 86400.0 + :extend_s
WHERE (id, lease) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:refs))
RETURNING id, available_at;

-- name: done_match :many
-- Acks whose earlier attempt committed (its reply was lost): the done table still has them.
SELECT id FROM {p}done
WHERE (id, lease) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:refs));

-- name: dead_insert :exec
INSERT INTO {p}dead (id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, error, dead_at)
VALUES (:id, :topic, :key, :kind, :payload, :payload_bytes, :headers, :priority, :attempts,
        :created_at, :first_available_at, :received_at, :error,
        (julianday('now') - 2440587.5) * 86400.0);

-- name: message_dead_letter :exec
INSERT INTO {p}dead (id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, error, dead_at)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, :error, (julianday('now') - 2440587.5) * 86400.0
FROM {p}message WHERE id = :id AND lease = :lease;

-- name: message_ack_one :one
DELETE FROM {p}message WHERE id = :id AND lease = :lease RETURNING id;

-- name: message_peek :many
SELECT * FROM {p}message WHERE topic = :topic
ORDER BY priority DESC, available_at, id LIMIT :limit;

-- name: message_get :one
SELECT * FROM {p}message WHERE id = :id;

-- name: message_topics :many
SELECT topic FROM {p}message UNION SELECT topic FROM {p}dead ORDER BY 1;

-- name: message_stats :many
SELECT topic,
       sum(available_at <= t.now) AS ready,
       sum(available_at > t.now AND lease IS NULL) AS scheduled,
       sum(available_at > t.now AND lease IS NOT NULL) AS in_flight,
       t.now - min(CASE WHEN available_at <= t.now THEN available_at END) AS oldest_ready_age
FROM {p}message, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE (:topic IS NULL OR topic = :topic)
GROUP BY topic;

-- name: message_stats_topic :many
-- One topic, counted through the claim index (stats() of the small topics of a big table).
SELECT topic,
       sum(available_at <= t.now) AS ready,
       sum(available_at > t.now AND lease IS NULL) AS scheduled,
       sum(available_at > t.now AND lease IS NOT NULL) AS in_flight,
       t.now - min(CASE WHEN available_at <= t.now THEN available_at END) AS oldest_ready_age
FROM {p}message, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE topic = :topic
GROUP BY topic;

-- name: message_id_span :one
SELECT min(id) AS lo, max(id) AS hi FROM {p}message;

-- name: message_stats_sample :many
-- The rows of evenly spread id windows (rowid ranges), counted as message_stats does; the
-- caller scales the counts up by stride / width.
WITH RECURSIVE w(lo) AS (
    SELECT :lo
    UNION ALL
    SELECT lo + :stride FROM w WHERE lo + :stride <= :hi
)
SELECT m.topic,
       sum(m.available_at <= t.now) AS ready,
       sum(m.available_at > t.now AND m.lease IS NULL) AS scheduled,
       sum(m.available_at > t.now AND m.lease IS NOT NULL) AS in_flight,
       count(DISTINCT w.lo) AS windows
FROM w CROSS JOIN {p}message m ON m.id >= w.lo AND m.id < w.lo + :width,
     (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE (:topic IS NULL OR m.topic = :topic)
GROUP BY m.topic;

-- name: message_topic_after :one
-- The next live topic after `after`, one claim-index probe (stats() walks the topics so).
SELECT topic FROM {p}message WHERE topic > :after ORDER BY topic LIMIT 1;

-- name: message_priority_at_most :one
-- A topic's highest priority at or below `at_most`, one claim-index probe.
SELECT priority FROM {p}message WHERE topic = :topic AND priority <= :at_most
ORDER BY priority DESC LIMIT 1;

-- name: message_priority_head :one
-- One priority of a topic from the claim index: the age of its oldest ready message (the
-- first entry), and its scheduled and leased messages (the entries after now), counted up to
-- `cap` each.
SELECT t.now - (SELECT available_at FROM {p}message
                WHERE topic = :topic AND priority = :priority AND available_at <= t.now
                ORDER BY available_at LIMIT 1) AS oldest_ready_age,
       (SELECT count(*) FROM (
           SELECT 1 FROM {p}message
           WHERE topic = :topic AND priority = :priority AND available_at > t.now
             AND lease IS NULL LIMIT :cap)) AS scheduled,
       (SELECT count(*) FROM (
           SELECT 1 FROM {p}message
           WHERE topic = :topic AND priority = :priority AND available_at > t.now
             AND lease IS NOT NULL LIMIT :cap)) AS in_flight
FROM (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t;

-- name: dead_stats :many
SELECT topic, count(*) AS dead FROM {p}dead WHERE (:topic IS NULL OR topic = :topic) GROUP BY topic;

-- name: done_stats :many
SELECT topic, count(*) AS done FROM {p}done WHERE (:topic IS NULL OR topic = :topic) GROUP BY topic;

-- name: message_purge :one
DELETE FROM {p}message WHERE topic = :topic;

-- name: dead_list :many
SELECT * FROM {p}dead WHERE topic = :topic ORDER BY id LIMIT :limit;

-- name: dead_requeue :exec
-- Back as a fresh message with the same id; one whose key is live again stays dead.
INSERT OR IGNORE INTO {p}message (id, topic, key, kind, payload, payload_bytes, headers, priority,
                        attempts, created_at, available_at, first_available_at, last_error)
SELECT d.id, d.topic, d.key, d.kind, d.payload, d.payload_bytes, d.headers, d.priority, 0,
       d.created_at, t.now, t.now, d.error
FROM {p}dead d, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE d.topic = :topic AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
ORDER BY d.id;

-- name: dead_delete_requeued :exec
-- The dead letters that dead_requeue moved back (now live under the same id).
DELETE FROM {p}dead
WHERE topic = :topic AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND id IN (SELECT id FROM {p}message);

-- name: dead_purge :exec
DELETE FROM {p}dead
WHERE topic = :topic AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)));

-- name: lease_rows :many
-- A group lease is found by its id range, not by scanning the topic; one of n readers
-- takes the ids with id % n = k.
SELECT * FROM {p}message WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease AND id % :n = :k
ORDER BY priority DESC, id;

-- name: lease_read :many
-- lease_rows for a reader that passes the rows on as they are (the Spark source): the JSON
-- columns are text here already.
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       available_at, first_available_at, received_at, lease
FROM {p}message WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease AND id % :n = :k
ORDER BY priority DESC, id;

-- name: done_insert_lease :exec
INSERT INTO {p}done (id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
                     created_at, first_available_at, received_at, done_at, lease)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, (julianday('now') - 2440587.5) * 86400.0, lease
FROM {p}message WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease;

-- name: lease_ack :exec
DELETE FROM {p}message WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease;

-- name: lease_extend :exec
UPDATE {p}message SET available_at = (julianday('now') - 2440587.5) * 86400.0 + :extend_s
WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease;

-- name: lease_extend_ending :exec
-- lease_extend of the leases that end within within_s only: a lease taken a moment ago is
-- not rewritten.
UPDATE {p}message SET available_at = (julianday('now') - 2440587.5) * 86400.0 + :extend_s
WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease
  AND available_at < (julianday('now') - 2440587.5) * 86400.0 + :within_s;

-- name: lease_release :exec
-- A group lease given back unread (the stream source's batch leased ahead of Spark): due now,
-- its lease cleared (its token may be used again) and the attempt its claim charged refunded.
UPDATE {p}message
SET lease = NULL, attempts = max(attempts - 1, 0),
    available_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id BETWEEN :lo AND :hi AND topic = :topic AND lease = :lease;

-- name: stage_insert :exec
INSERT INTO {p}stage (job, part, topic, key, kind, payload, payload_bytes, headers, priority,
                      delay_s, at)
VALUES (:job, :part, :topic, :key, :kind, :payload, :payload_bytes, :headers, :priority,
        :delay_s, :at);

-- name: load_job_open :exec
INSERT OR IGNORE INTO {p}load_job (job, state, created_at)
VALUES (:job, 'open', (julianday('now') - 2440587.5) * 86400.0);

-- name: load_job_reopen :exec
-- A job id reused after an abort starts afresh.
UPDATE {p}load_job SET state = 'open', created_at = (julianday('now') - 2440587.5) * 86400.0,
    finished_at = NULL
WHERE job = :job AND state = 'aborted';

-- name: load_job_share :one
-- The staging transaction already holds SQLite's one write lock (BEGIN IMMEDIATE), which is
-- what the server databases take a shared row lock for.
SELECT state FROM {p}load_job WHERE job = :job;

-- name: load_job_lock :one
-- A commit or discard holds the write lock already; the job's row exists (load_job_open).
SELECT state FROM {p}load_job WHERE job = :job;

-- name: load_job_state :one
SELECT state FROM {p}load_job WHERE job = :job;

-- name: load_job_finish :exec
INSERT INTO {p}load_job (job, state, created_at, finished_at, rows)
VALUES (:job, :state, (julianday('now') - 2440587.5) * 86400.0,
        (julianday('now') - 2440587.5) * 86400.0, :rows)
ON CONFLICT (job) DO UPDATE SET state = excluded.state, finished_at = excluded.finished_at,
                                rows = excluded.rows;

-- name: stage_publish :exec
-- Staged rows keep their order (sid); the due time is taken now, at publish.
INSERT INTO {p}message (topic, key, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT s.topic, s.key, s.kind, s.payload, s.payload_bytes, s.headers, s.priority, t.now,
       max(COALESCE(s.at, t.now + s.delay_s), t.now), COALESCE(s.at, t.now + s.delay_s)
FROM {p}stage s, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE s.job = :job AND s.part IN (SELECT value FROM json_each(:parts))
ORDER BY s.sid
ON CONFLICT DO NOTHING;

-- name: stage_publish_replace :exec
INSERT INTO {p}message (topic, key, kind, payload, payload_bytes, headers, priority,
                        created_at, available_at, first_available_at)
SELECT s.topic, s.key, s.kind, s.payload, s.payload_bytes, s.headers, s.priority, t.now,
       max(COALESCE(s.at, t.now + s.delay_s), t.now), COALESCE(s.at, t.now + s.delay_s)
FROM {p}stage s, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) t
WHERE s.job = :job AND s.part IN (SELECT value FROM json_each(:parts))
ORDER BY s.sid
ON CONFLICT (topic, key) WHERE key IS NOT NULL DO UPDATE SET
    kind = excluded.kind, payload = excluded.payload, payload_bytes = excluded.payload_bytes,
    headers = excluded.headers, priority = excluded.priority, attempts = 0, lease = NULL,
    last_error = NULL, progress = NULL, received_at = NULL,
    available_at = excluded.available_at, first_available_at = excluded.first_available_at;

-- name: stage_count :one
SELECT count(*) AS n FROM {p}stage
WHERE job = :job AND part IN (SELECT value FROM json_each(:parts));

-- name: stage_delete_job :exec
DELETE FROM {p}stage WHERE job = :job;

-- name: stage_stale_jobs :many
SELECT job FROM {p}load_job
WHERE state = 'open' AND created_at <= (julianday('now') - 2440587.5) * 86400.0 - :older_than_s;

-- name: history_bounds_live :one
SELECT min(id) AS lo, max(id) AS hi FROM {p}message WHERE (:topic IS NULL OR topic = :topic);

-- name: history_rows_live :many
-- Live messages by id range, for snapshots (the lease column is left to the caller).
SELECT * FROM {p}message
WHERE id BETWEEN :lo AND :hi AND (:topic IS NULL OR topic = :topic)
  AND (:before IS NULL OR created_at < :before)
ORDER BY id;

-- name: history_bounds_dead :one
SELECT min(id) AS lo, max(id) AS hi FROM {p}dead WHERE (:topic IS NULL OR topic = :topic);

-- name: history_bounds_done :one
SELECT min(id) AS lo, max(id) AS hi FROM {p}done WHERE (:topic IS NULL OR topic = :topic);

-- name: history_rows_dead :many
SELECT * FROM {p}dead
WHERE id BETWEEN :lo AND :hi AND (:topic IS NULL OR topic = :topic)
  AND (:before IS NULL OR dead_at < :before)
ORDER BY id;

-- name: history_rows_done :many
SELECT * FROM {p}done
WHERE id BETWEEN :lo AND :hi AND (:topic IS NULL OR topic = :topic)
  AND (:before IS NULL OR done_at < :before)
ORDER BY id;

-- name: history_delete_dead :exec
DELETE FROM {p}dead WHERE id IN (SELECT value FROM json_each(:ids))
  AND (:before IS NULL OR dead_at < :before);

-- name: history_delete_done :exec
DELETE FROM {p}done WHERE id IN (SELECT value FROM json_each(:ids))
  AND (:before IS NULL OR done_at < :before);

-- --- tableq doctor: read-only facts about the database file (judged in tableq.doctor) -------

-- name: doctor_durability :one
-- synchronous is per connection (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA): this is what tableq's own
-- connections use (connect(..., synchronous=...), FULL by default).
SELECT s.synchronous AS synchronous, j.journal_mode AS journal_mode
FROM pragma_synchronous() AS s, pragma_journal_mode() AS j;

-- name: doctor_size :one
-- The database file's pages and how many of them are free (every table shares the file; free
-- pages are reused, and only VACUUM gives them back).
SELECT c.page_count AS page_count, f.freelist_count AS free_pages, s.page_size AS page_size
FROM pragma_page_count() AS c, pragma_freelist_count() AS f, pragma_page_size() AS s;

-- --- access tokens and idempotency records of the HTTP server ------------------------------

-- name: token_insert :exec
INSERT INTO {p}token (id, secret_sha256, role, topics, name, access_key, sqs_secret,
                      created_at, expires_at)
VALUES (:id, :secret_sha256, :role, :topics, :name, :access_key, :sqs_secret,
        (julianday('now') - 2440587.5) * 86400.0,
        (julianday('now') - 2440587.5) * 86400.0 + :expires_in_s);

-- name: token_by_secret :one
SELECT *, (julianday('now') - 2440587.5) * 86400.0 AS db_now FROM {p}token
WHERE secret_sha256 = :secret_sha256;

-- name: token_by_access_key :one
SELECT *, (julianday('now') - 2440587.5) * 86400.0 AS db_now FROM {p}token
WHERE access_key = :access_key;

-- name: token_list :many
SELECT *, (julianday('now') - 2440587.5) * 86400.0 AS db_now FROM {p}token
ORDER BY created_at, id;

-- name: token_revoke :exec
UPDATE {p}token SET revoked_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :id AND revoked_at IS NULL;

-- name: idempotency_claim :exec
-- Runs inside the send's transaction; BEGIN IMMEDIATE already serialises writers here.
INSERT OR IGNORE INTO {p}idempotency (token_id, idem_key, fingerprint, status, created_at)
VALUES (:token_id, :idem_key, :fingerprint, 0, (julianday('now') - 2440587.5) * 86400.0);

-- name: idempotency_get :one
SELECT fingerprint, status, response FROM {p}idempotency
WHERE token_id = :token_id AND idem_key = :idem_key;

-- name: idempotency_finish :exec
UPDATE {p}idempotency SET status = :status, response = :response
WHERE token_id = :token_id AND idem_key = :idem_key;

-- name: idempotency_expire :exec
DELETE FROM {p}idempotency
WHERE created_at < (julianday('now') - 2440587.5) * 86400.0 - :older_than_s;
