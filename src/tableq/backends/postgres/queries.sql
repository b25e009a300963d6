-- tableq named queries for PostgreSQL (psycopg %(name)s parameters; {schema} is tableq's
-- schema). Times come from the server clock: statement_timestamp(), stable within a statement
-- (so index range scans can use it) and fresh in every statement of a long transaction,
-- unlike now(), which is frozen at transaction start.
--
-- Two rules, and the sessions' planner settings (session_plans), keep the plans right when
-- the statistics are wrong (0007_claim_index_due.sql): once the queue is drained VACUUM
-- records message as empty, even while a held snapshot fills it with dead versions, so the
-- planner costs a scan of all of it as one row. tests/test_stale_statistics.py checks them.
--   - A statement that finds messages by id restricts message itself with `id = ANY(...)`,
--     even where a join on id says the same: the scan is then a primary-key lookup of those
--     ids, never a walk of an index that the join filters afterwards.
--   - The claim index is partial: only a statement that compares available_at can use it.
--     One that reads a topic through it and takes any due time says available_at >=
--     '-infinity' (not IS NOT NULL, which PostgreSQL 17 drops on a NOT NULL column).

-- name: server_version :one
SELECT current_setting('server_version_num')::int AS version;

-- name: schema_create :exec
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: migration_lock :exec
-- Migrators in other processes wait here; the lock ends with the transaction.
SELECT pg_advisory_xact_lock(hashtext('tableq.migrate.' || %(schema)s));

-- name: migration_create :exec
CREATE TABLE IF NOT EXISTS {schema}.migration (
    version integer PRIMARY KEY, name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT statement_timestamp()
);

-- name: migration_versions :many
SELECT version FROM {schema}.migration ORDER BY version;

-- name: migration_record :exec
INSERT INTO {schema}.migration (version, name) VALUES (%(version)s, %(name)s);

-- name: session_time_zone :exec
-- Every connection the library opens runs in UTC: psycopg then hands out datetimes that need
-- no conversion.
SET TimeZone = 'UTC';

-- name: session_plans :exec
-- Every connection the library opens plans without bitmap scans, nested loops and sequential
-- scans (each stays available where nothing else can run a statement). Its statements walk
-- an index in order or look rows up by key, and the planner cannot see that they are better:
-- a queue's statistics are mostly wrong. Once drained, VACUUM records the table as empty,
-- with or without the dead row versions a held snapshot keeps in it, and every estimate
-- downstream becomes one row. Measured with such statistics:
--   - bitmap scans: message_claim_floor became a bitmap over the whole range from the floor
--     and a sort, 19 ms a claim against 1.5 ms;
--   - nested loops: a claim's UPDATE of the rows it locked rescanned them once per row,
--     18 s for a claim of 10,000 whose statement otherwise takes 0.2 s;
--   - sequential scans: the same UPDATE, a thousand rows, read the table once per row.
-- A plan that has to keep a disabled step costs more than 10^10, and JIT compiled it then:
-- half a second a claim. So no JIT either (for statements of a few milliseconds it never pays).
SELECT set_config('enable_bitmapscan', 'off', false), set_config('enable_nestloop', 'off', false),
       set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false);

-- name: idle_transaction_limit :exec
-- Every connection the library opens: a transaction of it left idle (an exactly-once worker
-- that hangs, a worker cut off between a last attempt's charge and its COMMIT) is rolled back
-- after transaction_idle_timeout_s instead of holding its row locks (and hiding its messages
-- from SKIP LOCKED) until the server noticed, as on MariaDB.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, false);

-- name: savepoint_set :exec
SAVEPOINT tableq_send;

-- name: savepoint_rollback :exec
ROLLBACK TO SAVEPOINT tableq_send;

-- name: savepoint_release :exec
RELEASE SAVEPOINT tableq_send;

-- name: connection_database :one
-- Which database a connection reaches, to refuse a caller's connection= to another one. The
-- queue's statements name their schema, so the database and the server decide: the
-- server's start time tells two servers apart whatever their address (TCP or socket).
-- As text in a fixed form: the caller's connection may load timestamps its own way (Django's
-- naive ones), and float text follows its extra_float_digits.
SELECT current_database()::text AS database,
       to_char(pg_postmaster_start_time() AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS')
           AS server_started;

-- name: clock_now :one
SELECT statement_timestamp() AS now;

-- name: test_clock_create :exec
-- Tests only (connect(test_clock=True)): the backend then reads "now" from this row instead
-- of statement_timestamp(), so the time stands still until a test moves it. Production
-- queries never name this table.
CREATE TABLE IF NOT EXISTS {schema}.test_clock (
    one boolean PRIMARY KEY DEFAULT true CHECK (one), clock timestamptz NOT NULL
);

-- name: test_clock_init :exec
INSERT INTO {schema}.test_clock (one, clock) VALUES (true, statement_timestamp())
ON CONFLICT DO NOTHING;

-- name: test_clock_advance :exec
UPDATE {schema}.test_clock SET clock = clock + make_interval(secs => %(by_s)s);

-- name: message_vacuum :exec
-- Run by the backend itself once enough rows churned (vacuum.py); SKIP_LOCKED: when another
-- (autovacuum's VACUUM or ANALYZE, another process's vacuum) holds the table, this one is
-- skipped with a warning and tried again soon, not waited for. TRUNCATE false: giving empty
-- tail pages back waits for a lock no busy queue leaves free (vacuums of 2-10 ms took 50-150
-- ms, and the pacing let the table grow meanwhile); the space is reused.
VACUUM (SKIP_LOCKED, TRUNCATE false) {schema}.message;

-- name: message_swept :one
-- What the VACUUM just before left: live rows and the dead row versions it could not remove yet
-- (PostgreSQL 15+ has them at once; before, the statistics collector may lag, and the pacing
-- then waits as for a vacuum that removed little). Live rows are counted while there are
-- fewer than vacuum.py's COUNTED_BELOW (an index-only count, which the vacuum just made cheap),
-- the planner's estimate beyond. The estimate alone fed on the table's growth: VACUUM
-- extrapolates the rows of the pages it skips, a 20k backlog read as up to 27k, and the
-- pacing let that much more churn in between vacuums (vacuum.py).
SELECT CASE WHEN l.n < %(counted)s THEN l.n ELSE GREATEST(c.reltuples, l.n) END AS n,
       COALESCE(s.n_dead_tup, 0) AS dead
FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid,
     LATERAL (SELECT count(*) AS n FROM (SELECT FROM {schema}.message LIMIT %(counted)s) m) l
WHERE c.oid = '{schema}.message'::regclass;

-- name: listen :exec
-- LISTEN takes no parameters: the schema's wake-up channel is named once, at load.
LISTEN {channel};

-- name: wake_register :many
-- This LISTEN session waits for these topics ('' = all): sends see its shared wait locks and
-- notify (0004_quiet_sends.sql). Session locks: they end with the session.
SELECT pg_advisory_lock_shared(hashtext(%(schema)s || '_wake_wait'), hashtext(t))
FROM unnest(%(topics)s::text[]) t;

-- name: wake_settled :one
-- After wake_register: true once no send that looked before it is still in flight (each one
-- holds its topic's send lock, shared, until it ends). Tried, never waited for.
SELECT bool_and(pg_try_advisory_xact_lock(hashtext(%(schema)s || '_wake_send'), hashtext(t)))
       AS settled
FROM unnest(%(topics)s::text[]) t;

-- name: wake_unregister :one
-- The session holds no other advisory locks.
SELECT pg_advisory_unlock_all();

-- name: message_insert :many
-- One round trip per batch: arrays in, rows out. Ids follow the array order. Each topic sent
-- due messages wakes its listening workers once (0005_wake_in_statements.sql); `woke` is
-- selected so that the planner keeps the join that runs it.
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT r.topic, r.key, r.kind, r.payload::jsonb, r.payload_bytes, r.headers::jsonb, r.priority,
           statement_timestamp(), GREATEST(r.due, statement_timestamp()), r.due
    FROM (SELECT u.*, COALESCE(u.at, statement_timestamp() + make_interval(secs => u.delay_s)) AS due
          FROM unnest(%(topics)b::text[], %(keys)b::text[], %(kinds)b::text[], %(payloads)b::text[],
                      %(datas)b::bytea[], %(headers)b::text[], %(priorities)b::int[],
                      %(ats)b::timestamptz[], %(delays)b::float8[])
               WITH ORDINALITY AS u(topic, key, kind, payload, payload_bytes, headers, priority, at,
                                    delay_s, ord)
          ORDER BY u.ord) r
    RETURNING id, key, topic, available_at
), woke AS (
    SELECT {schema}.wake(topic, count(*)) AS woke
    FROM sent WHERE available_at <= statement_timestamp() GROUP BY topic
)
SELECT id, key, w.woke FROM sent LEFT JOIN (SELECT bool_or(woke) AS woke FROM woke) w ON true;

-- name: message_insert_ignore :many
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT r.topic, r.key, r.kind, r.payload::jsonb, r.payload_bytes, r.headers::jsonb, r.priority,
           statement_timestamp(), GREATEST(r.due, statement_timestamp()), r.due
    FROM (SELECT u.*, COALESCE(u.at, statement_timestamp() + make_interval(secs => u.delay_s)) AS due
          FROM unnest(%(topics)b::text[], %(keys)b::text[], %(kinds)b::text[], %(payloads)b::text[],
                      %(datas)b::bytea[], %(headers)b::text[], %(priorities)b::int[],
                      %(ats)b::timestamptz[], %(delays)b::float8[])
               WITH ORDINALITY AS u(topic, key, kind, payload, payload_bytes, headers, priority, at,
                                    delay_s, ord)
          ORDER BY u.ord) r
    ON CONFLICT (topic, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING id, key, topic, available_at
), woke AS (
    SELECT {schema}.wake(topic, count(*)) AS woke
    FROM sent WHERE available_at <= statement_timestamp() GROUP BY topic
)
SELECT id, key, w.woke FROM sent LEFT JOIN (SELECT bool_or(woke) AS woke FROM woke) w ON true;

-- name: message_insert_replace :many
-- Replacing resets the delivery: a worker holding the old lease gets LeaseLost on ack.
-- xmax = 0 tells a freshly inserted row from an updated one.
-- A replaced message due now wakes listening workers as a sent one does.
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT r.topic, r.key, r.kind, r.payload::jsonb, r.payload_bytes, r.headers::jsonb, r.priority,
           statement_timestamp(), GREATEST(r.due, statement_timestamp()), r.due
    FROM (SELECT u.*, COALESCE(u.at, statement_timestamp() + make_interval(secs => u.delay_s)) AS due
          FROM unnest(%(topics)b::text[], %(keys)b::text[], %(kinds)b::text[], %(payloads)b::text[],
                      %(datas)b::bytea[], %(headers)b::text[], %(priorities)b::int[],
                      %(ats)b::timestamptz[], %(delays)b::float8[])
               WITH ORDINALITY AS u(topic, key, kind, payload, payload_bytes, headers, priority, at,
                                    delay_s, ord)
          ORDER BY u.ord) r
    ON CONFLICT (topic, key) WHERE key IS NOT NULL DO UPDATE SET
        kind = EXCLUDED.kind, payload = EXCLUDED.payload, payload_bytes = EXCLUDED.payload_bytes,
        headers = EXCLUDED.headers, priority = EXCLUDED.priority, attempts = 0, lease = NULL,
        last_error = NULL, progress = NULL, received_at = NULL,
        available_at = EXCLUDED.available_at, first_available_at = EXCLUDED.first_available_at
    RETURNING id, key, topic, available_at, (xmax = 0) AS inserted
), woke AS (
    SELECT {schema}.wake(topic, count(*)) AS woke
    FROM sent WHERE available_at <= statement_timestamp() GROUP BY topic
)
SELECT id, key, inserted, w.woke
FROM sent LEFT JOIN (SELECT bool_or(woke) AS woke FROM woke) w ON true;

-- name: message_insert_due :many
-- A single unkeyed send due now, the commonest send: nothing can conflict and nothing is
-- computed, so it is a plain VALUES row and calls wake() from RETURNING. Against
-- message_insert_one (a CTE, the due-time expressions, a CASE) it saves the server about
-- 10 us a send (2026-11-29, shared server, alternating rounds of 2,000).
INSERT INTO {schema}.message (topic, kind, payload, payload_bytes, headers, priority,
                              created_at, available_at, first_available_at)
VALUES (%(topic)s, %(kind)s, %(payload)s::jsonb, %(data)s, %(headers)s::jsonb, %(priority)s,
        statement_timestamp(), statement_timestamp(), statement_timestamp())
RETURNING id, {schema}.wake(topic, 1) AS woke;

-- name: message_insert_one :many
-- message_insert for a single send, over scalars: array parameters cost a single send about
-- a quarter of its time (dumping nine arrays, and unnest's costlier plan). A CASE, so that
-- only a message due now calls wake().
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT %(topic)s, %(key)s, %(kind)s, %(payload)s::jsonb, %(data)s, %(headers)s::jsonb,
           %(priority)s, statement_timestamp(), GREATEST(d.due, statement_timestamp()), d.due
    FROM (SELECT COALESCE(%(at)s::timestamptz,
                          statement_timestamp() + make_interval(secs => %(delay_s)s::float8)) AS due) d
    RETURNING id, key, topic, available_at
)
SELECT id, key,
       CASE WHEN available_at <= statement_timestamp() THEN {schema}.wake(topic, 1) END AS woke
FROM sent;

-- name: message_insert_one_ignore :many
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT %(topic)s, %(key)s, %(kind)s, %(payload)s::jsonb, %(data)s, %(headers)s::jsonb,
           %(priority)s, statement_timestamp(), GREATEST(d.due, statement_timestamp()), d.due
    FROM (SELECT COALESCE(%(at)s::timestamptz,
                          statement_timestamp() + make_interval(secs => %(delay_s)s::float8)) AS due) d
    ON CONFLICT (topic, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING id, key, topic, available_at
)
SELECT id, key,
       CASE WHEN available_at <= statement_timestamp() THEN {schema}.wake(topic, 1) END AS woke
FROM sent;

-- name: message_insert_one_replace :many
-- A replaced message due now wakes listening workers as a sent one does.
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT %(topic)s, %(key)s, %(kind)s, %(payload)s::jsonb, %(data)s, %(headers)s::jsonb,
           %(priority)s, statement_timestamp(), GREATEST(d.due, statement_timestamp()), d.due
    FROM (SELECT COALESCE(%(at)s::timestamptz,
                          statement_timestamp() + make_interval(secs => %(delay_s)s::float8)) AS due) d
    ON CONFLICT (topic, key) WHERE key IS NOT NULL DO UPDATE SET
        kind = EXCLUDED.kind, payload = EXCLUDED.payload, payload_bytes = EXCLUDED.payload_bytes,
        headers = EXCLUDED.headers, priority = EXCLUDED.priority, attempts = 0, lease = NULL,
        last_error = NULL, progress = NULL, received_at = NULL,
        available_at = EXCLUDED.available_at, first_available_at = EXCLUDED.first_available_at
    RETURNING id, key, topic, available_at, (xmax = 0) AS inserted
)
SELECT id, key, inserted,
       CASE WHEN available_at <= statement_timestamp() THEN {schema}.wake(topic, 1) END AS woke
FROM sent;

-- name: message_ids_take :one
-- Ids for a batch sent by COPY (message_copy_sent), which cannot return the ids it assigns.
-- The identity column's own sequence, named as PostgreSQL names it (0001_init.sql).
SELECT array_agg(nextval('{schema}.message_id_seq')) AS ids FROM generate_series(1, %(n)s);

-- name: wake_topics :many
-- After message_copy_sent: wakes the listening workers of each topic, as a send does.
SELECT {schema}.wake(t.topic, t.n) AS woke
FROM unnest(%(topics)b::text[], %(counts)b::bigint[]) AS t(topic, n);

-- name: message_copy_sent :copy
-- An unkeyed batch due now: the fastest way in. The due times default to the server's time;
-- wake_topics follows it (COPY cannot call wake()).
COPY {schema}.message (id, topic, kind, payload, payload_bytes, headers, priority) FROM STDIN;

-- name: message_find_keys :many
SELECT m.id, m.topic, m.key FROM {schema}.message m
JOIN unnest(%(topics)b::text[], %(keys)b::text[]) AS u(topic, key)
  ON m.topic = u.topic AND m.key = u.key
WHERE m.topic = ANY(%(topics)b::text[]) AND m.key = ANY(%(keys)b::text[]);

-- name: message_claim :many
-- SKIP LOCKED lets concurrent receivers pass over each other's rows instead of waiting.
-- Rows already received max_attempts times go to the dead-letter store instead; the final
-- LEFT JOIN returns one row even when nothing was leased, to carry the dead-lettered count.
WITH due AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), spent AS (
    DELETE FROM {schema}.message m USING due
    WHERE m.id = due.id AND due.attempts >= %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING m.*
), dead_lettered AS (
    INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                               attempts, created_at, first_available_at, received_at, error,
                               dead_at)
    SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
           created_at, first_available_at, received_at,
           COALESCE(last_error, 'received ' || attempts || ' times without an ack'),
           statement_timestamp()
    FROM spent
    RETURNING 1
), ranked AS (
    -- A NULL charge charges every leased message; n charges the first n in delivery order
    -- (a worker charges its prefetched messages later, when their handlers start), except a
    -- last allowed attempt beyond the first charge_last (ClaimSpec.charges).
    SELECT id, priority, available_at,
           CASE WHEN %(charge)s::bigint IS NULL THEN true
                ELSE rn <= COALESCE(%(charge_last)s::bigint, %(charge)s::bigint)
                     OR (rn <= %(charge)s::bigint AND attempts + 1 < %(max_attempts)s) END AS charged
    FROM (SELECT *, row_number() OVER (ORDER BY priority DESC, available_at, id) AS rn
          FROM due WHERE attempts < %(max_attempts)s) d
), leased AS (
    UPDATE {schema}.message m
    SET lease = COALESCE(%(lease)s::text, gen_random_uuid()::text),
        attempts = m.attempts + ranked.charged::int,
        received_at = statement_timestamp(),
        available_at = statement_timestamp() + make_interval(secs => %(vt)s)
    FROM ranked
    WHERE m.id = ranked.id AND m.id = ANY(ARRAY(SELECT id FROM ranked))
    RETURNING m.*, ranked.priority AS due_priority, ranked.available_at AS due_at,
              ranked.charged
)
SELECT l.*, b.dead_lettered
FROM (SELECT count(*) AS dead_lettered FROM dead_lettered) b LEFT JOIN leased l ON true
ORDER BY l.due_priority DESC, l.due_at, l.id;

-- name: message_claim_floor :many
-- message_claim while a snapshot is held or the topic has open load parts (floors.py): no
-- live message of priority f_priority sorts before (f_at, f_id), the floor, so that priority
-- is read from there instead of from its start, where the held snapshot keeps every dead row
-- version since it began and open loads keep their unpublished rows. `first` is the first row
-- of f_priority from the floor that this snapshot can see outside open loads (locked or not,
-- any attempt count: the next floor can be no later), and that priority's claim starts there,
-- so the dead versions and open rows before it are walked once. The priorities above and
-- below are read from their start, in delivery order, one after the other, each only as far
-- as the LIMIT pulls it: the same rows, in the same order, as message_claim. The first row
-- returned also carries `first`, the topic's count of load publishes (`gen`) and, when `look`
-- (floors.LOOK_EVERY_S), the horizon (floors.Horizon), for the next claim's floor.
WITH floor AS MATERIALIZED (
    -- The floor holds while no load part of the topic has been published since it was learned
    -- (f_gen: 0008_open_load_floors.sql); otherwise the level is read from its start again.
    SELECT gen, CASE WHEN gen <= %(f_gen)s THEN %(f_at)s::timestamptz ELSE '-infinity' END AS at,
           CASE WHEN gen <= %(f_gen)s THEN %(f_id)s::bigint ELSE 0 END AS id
    FROM (SELECT COALESCE(max(n), 0) AS gen FROM {schema}.load_published
          WHERE topic = %(topic)s) g
), first AS MATERIALIZED (
    SELECT available_at, id FROM {schema}.message
    WHERE topic = %(topic)s AND priority = %(f_priority)s
      AND (available_at, id) >= ((SELECT at FROM floor), (SELECT id FROM floor))
      AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY available_at, id
    LIMIT 1
), above AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND priority > %(f_priority)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), level AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND priority = %(f_priority)s
      AND (available_at, id) >= ((SELECT available_at FROM first), (SELECT id FROM first))
      AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), below AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND priority < %(f_priority)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT * FROM above UNION ALL SELECT * FROM level UNION ALL SELECT * FROM below
    LIMIT %(max)s
), horizon AS MATERIALIZED (
    SELECT * FROM {schema}.horizon() WHERE %(look)s::boolean  -- not called unless it looks
), spent AS (
    DELETE FROM {schema}.message m USING due
    WHERE m.id = due.id AND due.attempts >= %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING m.*
), dead_lettered AS (
    INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                               attempts, created_at, first_available_at, received_at, error,
                               dead_at)
    SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
           created_at, first_available_at, received_at,
           COALESCE(last_error, 'received ' || attempts || ' times without an ack'),
           statement_timestamp()
    FROM spent
    RETURNING 1
), ranked AS (
    -- A NULL charge charges every leased message; n charges the first n in delivery order
    -- (a worker charges its prefetched messages later, when their handlers start), except a
    -- last allowed attempt beyond the first charge_last (ClaimSpec.charges).
    SELECT id, priority, available_at,
           CASE WHEN %(charge)s::bigint IS NULL THEN true
                ELSE rn <= COALESCE(%(charge_last)s::bigint, %(charge)s::bigint)
                     OR (rn <= %(charge)s::bigint AND attempts + 1 < %(max_attempts)s) END AS charged
    FROM (SELECT *, row_number() OVER (ORDER BY priority DESC, available_at, id) AS rn
          FROM due WHERE attempts < %(max_attempts)s) d
), leased AS (
    UPDATE {schema}.message m
    SET lease = COALESCE(%(lease)s::text, gen_random_uuid()::text),
        attempts = m.attempts + ranked.charged::int,
        received_at = statement_timestamp(),
        available_at = statement_timestamp() + make_interval(secs => %(vt)s)
    FROM ranked
    WHERE m.id = ranked.id AND m.id = ANY(ARRAY(SELECT id FROM ranked))
    RETURNING m.*, ranked.priority AS due_priority, ranked.available_at AS due_at,
              ranked.charged
)
SELECT l.*, b.dead_lettered, m.*
FROM (SELECT count(*) AS dead_lettered FROM dead_lettered) b
LEFT JOIN (SELECT *, row_number() OVER (ORDER BY due_priority DESC, due_at, id) AS nth
           FROM leased) l ON true
-- The floor's facts ride on the first row only (a claim may return a thousand).
LEFT JOIN (SELECT f.available_at AS first_at, f.id AS first_id, h.hidden, h.oldest_snapshot,
                  h.oldest_write, h.open_topics, (SELECT gen FROM floor) AS gen,
                  statement_timestamp() AS claimed_at
           FROM (SELECT 1) one LEFT JOIN first f ON true LEFT JOIN horizon h ON true) m
  ON COALESCE(l.nth, 1) = 1
ORDER BY l.nth;

-- name: horizon :one
-- The database's oldest snapshot and oldest write in flight (0006_claim_floors.sql), asked
-- about once a second by a process that claims: a held snapshot turns on claim floors.
SELECT h.*, statement_timestamp() AS claimed_at FROM {schema}.horizon() h;

-- name: message_claim_where :many
-- message_claim with the receive filter (a separate statement, so the unfiltered claim
-- carries no filter predicates). The ids-only claim uses it too when filtered.
WITH due AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
      -- The receive filter, all bound: kind and key (NULL: any), and the payload fields as
      -- one JSON object, each compared as jsonb (1 = 1.0; "1" <> 1; a missing field, a
      -- non-object or bytes payload has no field and matches none).
      AND (%(f_kind)s::text IS NULL OR kind = %(f_kind)s)
      AND (%(f_key)s::text IS NULL OR key = %(f_key)s)
      AND NOT EXISTS (SELECT 1 FROM jsonb_each(%(f_fields)s::jsonb) f
                      WHERE payload -> f.key IS DISTINCT FROM f.value)
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), spent AS (
    DELETE FROM {schema}.message m USING due
    WHERE m.id = due.id AND due.attempts >= %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING m.*
), dead_lettered AS (
    INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                               attempts, created_at, first_available_at, received_at, error,
                               dead_at)
    SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
           created_at, first_available_at, received_at,
           COALESCE(last_error, 'received ' || attempts || ' times without an ack'),
           statement_timestamp()
    FROM spent
    RETURNING 1
), ranked AS (
    -- A NULL charge charges every leased message; n charges the first n in delivery order
    -- (a worker charges its prefetched messages later, when their handlers start), except a
    -- last allowed attempt beyond the first charge_last (ClaimSpec.charges).
    SELECT id, priority, available_at,
           CASE WHEN %(charge)s::bigint IS NULL THEN true
                ELSE rn <= COALESCE(%(charge_last)s::bigint, %(charge)s::bigint)
                     OR (rn <= %(charge)s::bigint AND attempts + 1 < %(max_attempts)s) END AS charged
    FROM (SELECT *, row_number() OVER (ORDER BY priority DESC, available_at, id) AS rn
          FROM due WHERE attempts < %(max_attempts)s) d
), leased AS (
    UPDATE {schema}.message m
    SET lease = COALESCE(%(lease)s::text, gen_random_uuid()::text),
        attempts = m.attempts + ranked.charged::int,
        received_at = statement_timestamp(),
        available_at = statement_timestamp() + make_interval(secs => %(vt)s)
    FROM ranked
    WHERE m.id = ranked.id AND m.id = ANY(ARRAY(SELECT id FROM ranked))
    RETURNING m.*, ranked.priority AS due_priority, ranked.available_at AS due_at,
              ranked.charged
)
SELECT l.*, b.dead_lettered
FROM (SELECT count(*) AS dead_lettered FROM dead_lettered) b LEFT JOIN leased l ON true
ORDER BY l.due_priority DESC, l.due_at, l.id;

-- name: message_claim_ids :many
-- message_claim for a group lease held under one caller-chosen token, returning only the
-- leased ids (the Spark source reads the rows later by their lease), so 10k-row leases do not
-- carry their payloads back. Every leased message is charged an attempt (no `charge`), so
-- there is no ranking (about a tenth less time per 10k-row claim than message_claim).
-- SKIP LOCKED lets concurrent receivers pass over each other's rows instead of waiting.
-- Rows already received max_attempts times go to the dead-letter store instead; the final
-- LEFT JOIN returns one row even when nothing was leased, to carry the dead-lettered count.
WITH due AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), spent AS (
    DELETE FROM {schema}.message m USING due
    WHERE m.id = due.id AND due.attempts >= %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING m.*
), dead_lettered AS (
    INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                               attempts, created_at, first_available_at, received_at, error,
                               dead_at)
    SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
           created_at, first_available_at, received_at,
           COALESCE(last_error, 'received ' || attempts || ' times without an ack'),
           statement_timestamp()
    FROM spent
    RETURNING 1
), leased AS (
    UPDATE {schema}.message m
    SET lease = %(lease)s::text,
        attempts = m.attempts + 1,
        received_at = statement_timestamp(),
        available_at = statement_timestamp() + make_interval(secs => %(vt)s)
    FROM due
    WHERE m.id = due.id AND due.attempts < %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts < %(max_attempts)s))
    RETURNING m.id, due.priority AS due_priority, due.available_at AS due_at
)
SELECT l.id, b.dead_lettered
FROM (SELECT count(*) AS dead_lettered FROM dead_lettered) b LEFT JOIN leased l ON true
ORDER BY l.due_priority DESC, l.due_at, l.id;

-- name: message_claim_ids_floor :many
-- message_claim_ids from a floor, as message_claim_floor.
WITH floor AS MATERIALIZED (
    -- The floor holds while no load part of the topic has been published since it was learned
    -- (f_gen: 0008_open_load_floors.sql); otherwise the level is read from its start again.
    SELECT gen, CASE WHEN gen <= %(f_gen)s THEN %(f_at)s::timestamptz ELSE '-infinity' END AS at,
           CASE WHEN gen <= %(f_gen)s THEN %(f_id)s::bigint ELSE 0 END AS id
    FROM (SELECT COALESCE(max(n), 0) AS gen FROM {schema}.load_published
          WHERE topic = %(topic)s) g
), first AS MATERIALIZED (
    SELECT available_at, id FROM {schema}.message
    WHERE topic = %(topic)s AND priority = %(f_priority)s
      AND (available_at, id) >= ((SELECT at FROM floor), (SELECT id FROM floor))
      AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY available_at, id
    LIMIT 1
), above AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND priority > %(f_priority)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), level AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND priority = %(f_priority)s
      AND (available_at, id) >= ((SELECT available_at FROM first), (SELECT id FROM first))
      AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), below AS (
    SELECT id, attempts, priority, available_at FROM {schema}.message
    WHERE topic = %(topic)s AND priority < %(f_priority)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT * FROM above UNION ALL SELECT * FROM level UNION ALL SELECT * FROM below
    LIMIT %(max)s
), horizon AS MATERIALIZED (
    SELECT * FROM {schema}.horizon() WHERE %(look)s::boolean  -- not called unless it looks
), spent AS (
    DELETE FROM {schema}.message m USING due
    WHERE m.id = due.id AND due.attempts >= %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING m.*
), dead_lettered AS (
    INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                               attempts, created_at, first_available_at, received_at, error,
                               dead_at)
    SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts,
           created_at, first_available_at, received_at,
           COALESCE(last_error, 'received ' || attempts || ' times without an ack'),
           statement_timestamp()
    FROM spent
    RETURNING 1
), leased AS (
    UPDATE {schema}.message m
    SET lease = %(lease)s::text,
        attempts = m.attempts + 1,
        received_at = statement_timestamp(),
        available_at = statement_timestamp() + make_interval(secs => %(vt)s)
    FROM due
    WHERE m.id = due.id AND due.attempts < %(max_attempts)s
      AND m.id = ANY(ARRAY(SELECT id FROM due WHERE attempts < %(max_attempts)s))
    RETURNING m.id, due.priority, due.available_at AS due_at
)
SELECT l.id, l.priority, b.dead_lettered, m.*
FROM (SELECT count(*) AS dead_lettered FROM dead_lettered) b
LEFT JOIN (SELECT *, row_number() OVER (ORDER BY priority DESC, due_at, id) AS nth
           FROM leased) l ON true
LEFT JOIN (SELECT f.available_at AS first_at, f.id AS first_id, h.hidden, h.oldest_snapshot,
                  h.oldest_write, h.open_topics, (SELECT gen FROM floor) AS gen,
                  statement_timestamp() AS claimed_at
           FROM (SELECT 1) one LEFT JOIN first f ON true LEFT JOIN horizon h ON true) m
  ON COALESCE(l.nth, 1) = 1
ORDER BY l.nth;

-- name: message_take :many
WITH due AS (
    SELECT id FROM {schema}.message
    WHERE topic = %(topic)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.message m USING due
WHERE m.id = due.id AND m.id = ANY(ARRAY(SELECT id FROM due)) RETURNING m.*;

-- name: message_take_where :many
-- message_take with the receive filter.
WITH due AS (
    SELECT id FROM {schema}.message
    WHERE topic = %(topic)s AND available_at <= statement_timestamp()
      AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
      -- The receive filter, all bound: kind and key (NULL: any), and the payload fields as
      -- one JSON object, each compared as jsonb (1 = 1.0; "1" <> 1; a missing field, a
      -- non-object or bytes payload has no field and matches none).
      AND (%(f_kind)s::text IS NULL OR kind = %(f_kind)s)
      AND (%(f_key)s::text IS NULL OR key = %(f_key)s)
      AND NOT EXISTS (SELECT 1 FROM jsonb_each(%(f_fields)s::jsonb) f
                      WHERE payload -> f.key IS DISTINCT FROM f.value)
    ORDER BY priority DESC, available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.message m USING due
WHERE m.id = due.id AND m.id = ANY(ARRAY(SELECT id FROM due)) RETURNING m.*;

-- name: message_ack :many
-- Fenced on (id, lease): a stale lease matches nothing and changes nothing.
DELETE FROM {schema}.message m
USING unnest(%(ids)b::bigint[], %(leases)b::text[]) AS a(id, lease)
WHERE m.id = a.id AND m.lease = a.lease AND m.id = ANY(%(ids)b::bigint[])
RETURNING m.id;

-- name: message_ack_retain :many
WITH gone AS (
    DELETE FROM {schema}.message m
    USING unnest(%(ids)b::bigint[], %(leases)b::text[]) AS a(id, lease)
    WHERE m.id = a.id AND m.lease = a.lease AND m.id = ANY(%(ids)b::bigint[])
    RETURNING m.*
)
INSERT INTO {schema}.done (id, topic, key, kind, payload, payload_bytes, headers, priority,
                           attempts, created_at, first_available_at, received_at, done_at, lease)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, statement_timestamp(), lease
FROM gone
RETURNING id;

-- name: message_release :one
-- A message released due now (a nack back to now, a worker giving back what it never
-- started) wakes listening workers the way a send does.
WITH released AS (
    UPDATE {schema}.message
    SET lease = NULL, attempts = attempts - %(refund)s,
        available_at = statement_timestamp() + make_interval(secs => %(delay_s)s),
        last_error = COALESCE(%(error)s, last_error)
    WHERE id = %(id)s AND lease = %(lease)s
    RETURNING id, topic, available_at
)
SELECT id, CASE WHEN available_at <= statement_timestamp()
                THEN {schema}.wake(topic, 1)
           END AS woke
FROM released;

-- name: message_charge :many
-- A worker's prefetched message, charged its attempt as its handler starts; the lease is
-- extended in the same statement, so the handler starts on a full, confirmed lease. The
-- count is set to one more than the delivery was received with, never added to, so a charge
-- retried after its COMMIT's reply was lost counts once.
UPDATE {schema}.message m
SET attempts = GREATEST(m.attempts, a.attempts + 1),
    available_at = statement_timestamp() + make_interval(secs => %(extend_s)s)
FROM unnest(%(ids)b::bigint[], %(leases)b::text[], %(attempts)b::int[]) AS a(id, lease, attempts)
WHERE m.id = a.id AND m.lease = a.lease AND m.id = ANY(%(ids)b::bigint[])
RETURNING m.id, m.attempts, m.available_at;

-- name: message_extend :one
UPDATE {schema}.message
SET available_at = statement_timestamp() + make_interval(secs => %(extend_s)s),
    progress = COALESCE(%(progress)s::jsonb, progress)
WHERE id = %(id)s AND lease = %(lease)s
RETURNING available_at;

-- name: message_extend_many :many
UPDATE {schema}.message m
SET available_at = statement_timestamp() + make_interval(secs => %(extend_s)s)
FROM unnest(%(ids)b::bigint[], %(leases)b::text[]) AS a(id, lease)
WHERE m.id = a.id AND m.lease = a.lease AND m.id = ANY(%(ids)b::bigint[])
RETURNING m.id, m.available_at;

-- name: done_match :many
-- Acks whose earlier attempt committed (its reply was lost): the done table still has them.
SELECT d.id FROM {schema}.done d
JOIN unnest(%(ids)b::bigint[], %(leases)b::text[]) AS a(id, lease)
  ON d.id = a.id AND d.lease = a.lease
WHERE d.id = ANY(%(ids)b::bigint[]);

-- name: dead_insert :exec
INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                           attempts, created_at, first_available_at, received_at, error, dead_at)
VALUES (%(id)s, %(topic)s, %(key)s, %(kind)s, %(payload)s::jsonb, %(payload_bytes)s,
        %(headers)s::jsonb, %(priority)s, %(attempts)s, %(created_at)s, %(first_available_at)s,
        %(received_at)s, %(error)s, statement_timestamp());

-- name: message_dead_letter :one
WITH gone AS (
    DELETE FROM {schema}.message WHERE id = %(id)s AND lease = %(lease)s RETURNING *
)
INSERT INTO {schema}.dead (id, topic, key, kind, payload, payload_bytes, headers, priority,
                           attempts, created_at, first_available_at, received_at, error, dead_at)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, %(error)s, statement_timestamp()
FROM gone
RETURNING id;

-- name: message_peek :many
SELECT * FROM {schema}.message WHERE topic = %(topic)s AND available_at >= '-infinity'
  AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
ORDER BY priority DESC, available_at, id LIMIT %(limit)s;

-- name: message_get :one
SELECT * FROM {schema}.message WHERE id = %(id)s
  AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'));

-- name: message_topics :many
SELECT topic FROM {schema}.message
  WHERE (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
UNION SELECT topic FROM {schema}.dead ORDER BY 1;

-- name: message_stats :many
SELECT topic,
       count(*) FILTER (WHERE available_at <= t.now) AS ready,
       count(*) FILTER (WHERE available_at > t.now AND lease IS NULL) AS scheduled,
       count(*) FILTER (WHERE available_at > t.now AND lease IS NOT NULL) AS in_flight,
       extract(epoch FROM t.now - min(available_at) FILTER (WHERE available_at <= t.now))
           AS oldest_ready_age
FROM {schema}.message, (SELECT statement_timestamp() AS now) t
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
GROUP BY topic, t.now;

-- name: message_stats_topic :many
-- One topic, counted through the claim index (stats() of the small topics of a big table).
SELECT topic,
       count(*) FILTER (WHERE available_at <= t.now) AS ready,
       count(*) FILTER (WHERE available_at > t.now AND lease IS NULL) AS scheduled,
       count(*) FILTER (WHERE available_at > t.now AND lease IS NOT NULL) AS in_flight,
       extract(epoch FROM t.now - min(available_at) FILTER (WHERE available_at <= t.now))
           AS oldest_ready_age
FROM {schema}.message, (SELECT statement_timestamp() AS now) t
WHERE topic = %(topic)s AND available_at >= '-infinity'
  AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
GROUP BY topic, t.now;

-- name: message_id_span :one
SELECT min(id) AS lo, max(id) AS hi FROM {schema}.message;

-- name: message_stats_sample :many
-- The rows of evenly spread id windows (primary key ranges), counted as message_stats does;
-- the caller scales the counts up by stride / width. The LIMIT keeps each window a key range
-- of its own: a plain join is planned from the table's statistics, which in a queue are
-- often stale, and then reads the whole topic.
SELECT m.topic,
       count(*) FILTER (WHERE m.available_at <= t.now) AS ready,
       count(*) FILTER (WHERE m.available_at > t.now AND m.lease IS NULL) AS scheduled,
       count(*) FILTER (WHERE m.available_at > t.now AND m.lease IS NOT NULL) AS in_flight,
       count(DISTINCT w.lo) AS windows
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint, %(stride)s::bigint) AS w(lo),
     LATERAL (SELECT topic, available_at, lease, load_part FROM {schema}.message
              WHERE id >= w.lo AND id < w.lo + %(width)s::bigint
              LIMIT %(width)s::bigint) m,
     (SELECT statement_timestamp() AS now) t
WHERE (%(topic)s::text IS NULL OR m.topic = %(topic)s)
  AND (m.load_part IS NULL OR m.load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
GROUP BY m.topic, t.now;

-- name: message_topic_after :one
-- The next live topic after `after`, one claim-index probe (stats() walks the topics so).
SELECT topic FROM {schema}.message WHERE topic > %(after)s AND available_at >= '-infinity'
ORDER BY topic LIMIT 1;

-- name: message_priority_at_most :one
-- A topic's highest priority at or below `at_most`, one claim-index probe.
SELECT priority FROM {schema}.message
WHERE topic = %(topic)s AND priority <= %(at_most)s AND available_at >= '-infinity'
ORDER BY priority DESC LIMIT 1;

-- name: message_priority_head :one
-- One priority of a topic from the claim index: the age of its oldest ready message (the
-- first entry), and its scheduled and leased messages (the entries after now), counted up to
-- `cap` each.
SELECT extract(epoch FROM statement_timestamp() - (
           SELECT available_at FROM {schema}.message
           WHERE topic = %(topic)s AND priority = %(priority)s
             AND available_at <= statement_timestamp()
             AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
           ORDER BY available_at LIMIT 1)) AS oldest_ready_age,
       (SELECT count(*) FROM (
           SELECT 1 FROM {schema}.message
           WHERE topic = %(topic)s AND priority = %(priority)s
             AND available_at > statement_timestamp() AND lease IS NULL
             AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
           LIMIT %(cap)s) x) AS scheduled,
       (SELECT count(*) FROM (
           SELECT 1 FROM {schema}.message
           WHERE topic = %(topic)s AND priority = %(priority)s
             AND available_at > statement_timestamp() AND lease IS NOT NULL
           LIMIT %(cap)s) x) AS in_flight;

-- name: dead_stats :many
SELECT topic, count(*) AS dead FROM {schema}.dead
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s) GROUP BY topic;

-- name: done_stats :many
SELECT topic, count(*) AS done FROM {schema}.done
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s) GROUP BY topic;

-- name: message_purge :exec
DELETE FROM {schema}.message WHERE topic = %(topic)s AND available_at >= '-infinity'
  AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'));

-- name: dead_list :many
SELECT * FROM {schema}.dead WHERE topic = %(topic)s ORDER BY id LIMIT %(limit)s;

-- name: dead_requeue :many
-- Back as a fresh message with the same id, due now; one whose key is live again stays dead.
WITH moved AS (
    INSERT INTO {schema}.message (id, topic, key, kind, payload, payload_bytes, headers,
                                  priority, attempts, created_at, available_at,
                                  first_available_at, last_error)
    SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, 0, created_at,
           statement_timestamp(), statement_timestamp(), error
    FROM {schema}.dead
    WHERE topic = %(topic)s AND (%(ids)b::bigint[] IS NULL OR id = ANY(%(ids)b::bigint[]))
    ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id, topic
), gone AS (
    DELETE FROM {schema}.dead WHERE id = ANY(ARRAY(SELECT id FROM moved)) RETURNING id
), woke AS (
    SELECT {schema}.wake(topic, count(*)) AS woke FROM moved GROUP BY topic
)
SELECT id, w.woke FROM gone LEFT JOIN (SELECT bool_or(woke) AS woke FROM woke) w ON true;

-- name: dead_purge :exec
DELETE FROM {schema}.dead
WHERE topic = %(topic)s AND (%(ids)b::bigint[] IS NULL OR id = ANY(%(ids)b::bigint[]));

-- name: lease_rows :many
-- A group lease is found by its id range (the primary key), not by scanning the topic; one
-- of n readers takes the ids with id mod n = k.
SELECT * FROM {schema}.message
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s
  AND mod(id, %(n)s) = %(k)s
ORDER BY priority DESC, id;

-- name: lease_read :many
-- lease_rows for a reader that passes the rows on as they are (the Spark source): the JSON
-- columns come as their text, so the driver does not decode every payload on the way.
SELECT id, topic, key, kind, payload::text AS payload, payload_bytes, headers::text AS headers,
       priority, attempts, created_at, available_at, first_available_at, received_at, lease
FROM {schema}.message
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s
  AND mod(id, %(n)s) = %(k)s
ORDER BY priority DESC, id;

-- name: lease_ack :exec
DELETE FROM {schema}.message
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s;

-- name: lease_ack_retain :exec
WITH gone AS (
    DELETE FROM {schema}.message
    WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s
    RETURNING *
)
INSERT INTO {schema}.done (id, topic, key, kind, payload, payload_bytes, headers, priority,
                           attempts, created_at, first_available_at, received_at, done_at, lease)
SELECT id, topic, key, kind, payload, payload_bytes, headers, priority, attempts, created_at,
       first_available_at, received_at, statement_timestamp(), lease
FROM gone;

-- name: lease_extend :exec
UPDATE {schema}.message SET available_at = statement_timestamp() + make_interval(secs => %(extend_s)s)
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s;

-- name: lease_extend_ending :exec
-- lease_extend of the leases that end within within_s only: a lease taken a moment ago is
-- not rewritten (every extended row is a new row version and new index entries).
UPDATE {schema}.message SET available_at = statement_timestamp() + make_interval(secs => %(extend_s)s)
WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s
  AND available_at < statement_timestamp() + make_interval(secs => %(within_s)s);

-- name: lease_release :many
-- A group lease given back unread (the stream source's batch leased ahead of Spark): due now,
-- its lease cleared (its token may be used again) and the attempt its claim charged refunded;
-- listening workers wake once, as for a send. One row per released message.
WITH released AS (
    UPDATE {schema}.message
    SET lease = NULL, attempts = GREATEST(attempts - 1, 0), available_at = statement_timestamp()
    WHERE id BETWEEN %(lo)s AND %(hi)s AND topic = %(topic)s AND lease = %(lease)s
    RETURNING id
), woke AS (
    SELECT {schema}.wake(%(topic)s, count(*)) AS woke FROM released HAVING count(*) > 0
)
SELECT r.id FROM released r LEFT JOIN woke ON true;

-- name: stage_copy :copy
COPY {schema}.stage (job, part, topic, key, kind, payload, payload_bytes, headers, priority,
                     delay_s, at) FROM STDIN;

-- name: stage_async_commit :exec
-- Staging commits need not wait for the disk: staged rows stay invisible until a publish,
-- whose own (synchronous) commit flushes all earlier WAL; a crash in between loses rows and
-- their ledger counts together, which publish's expected-rows check turns into
-- LoadIncomplete.
SET LOCAL synchronous_commit = off;

-- name: load_job_open :exec
INSERT INTO {schema}.load_job (job, state, created_at) VALUES (%(job)s, 'open', statement_timestamp())
ON CONFLICT (job) DO NOTHING;

-- name: load_job_reopen :exec
-- A job id reused after an abort starts afresh.
UPDATE {schema}.load_job SET state = 'open', created_at = statement_timestamp(), finished_at = NULL
WHERE job = %(job)s AND state = 'aborted';

-- name: load_job_share :one
-- Held by every staging transaction, so a commit (which takes the row exclusively) waits for
-- the writers in flight, and a writer arriving after the commit sees it and writes nothing.
SELECT state FROM {schema}.load_job WHERE job = %(job)s FOR SHARE;

-- name: load_part_open :one
INSERT INTO {schema}.load_part (job, part, topic, state, rows)
VALUES (%(job)s, %(part)s, %(topic)s, 'open', %(rows)s)
ON CONFLICT (job, part, topic) DO UPDATE
SET rows = CASE WHEN load_part.state = 'open' THEN load_part.rows ELSE 0 END + EXCLUDED.rows,
    state = 'open'
RETURNING id;

-- name: message_copy :copy
-- Loaded rows due now: available_at and first_available_at default to the server's time.
COPY {schema}.message (topic, kind, payload, payload_bytes, headers, priority, load_part)
FROM STDIN;

-- name: message_copy_due :copy
COPY {schema}.message (topic, kind, payload, payload_bytes, headers, priority, load_part,
                       available_at, first_available_at) FROM STDIN;

-- name: load_part_rows :one
SELECT COALESCE(sum(rows), 0) AS n FROM {schema}.load_part
WHERE job = %(job)s AND part = ANY(%(parts)b::bigint[]) AND state = 'open';

-- name: load_part_publish :many
-- The O(parts) commit of directly loaded rows: their parts stop being open (and a trigger moves
-- each topic's count of publishes on, so that claims from floors read the topic from its start
-- again: 0008_open_load_floors.sql).
UPDATE {schema}.load_part SET state = 'published'
WHERE job = %(job)s AND part = ANY(%(parts)b::bigint[]) AND state = 'open'
RETURNING topic, rows;

-- name: load_part_drop :exec
-- Every other open part of the job: failed or duplicate task attempts, or an aborted load.
-- With none (the usual commit) the arrays are empty and nothing of message is read.
WITH dropped AS (
    UPDATE {schema}.load_part SET state = 'dropped' WHERE job = %(job)s AND state = 'open'
    RETURNING id, topic
)
DELETE FROM {schema}.message
WHERE topic = ANY(ARRAY(SELECT topic FROM dropped)) AND available_at >= '-infinity'
  AND load_part = ANY(ARRAY(SELECT id FROM dropped))
  AND (topic, load_part) IN (SELECT topic, id FROM dropped);

-- name: load_notify :exec
SELECT pg_notify(%(channel)s, json_build_object('topic', t.topic, 'n', t.n)::text)
FROM unnest(%(topics)b::text[], %(counts)b::bigint[]) AS t(topic, n);

-- name: load_job_lock :one
-- Takes the job's row lock, so two commits of one job run one after the other.
INSERT INTO {schema}.load_job (job, state, created_at) VALUES (%(job)s, 'open', statement_timestamp())
ON CONFLICT (job) DO UPDATE SET job = EXCLUDED.job
RETURNING state;

-- name: load_job_state :one
SELECT state FROM {schema}.load_job WHERE job = %(job)s;

-- name: load_job_finish :exec
UPDATE {schema}.load_job SET state = %(state)s, finished_at = statement_timestamp(), rows = %(rows)s
WHERE job = %(job)s;

-- name: stage_publish :one
-- How many rows went in; each topic sent due messages wakes its listening workers once.
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT s.topic, s.key, s.kind, s.payload, s.payload_bytes, s.headers, s.priority,
           statement_timestamp(), GREATEST(s.due, statement_timestamp()), s.due
    FROM (SELECT *, COALESCE(at, statement_timestamp() + make_interval(secs => delay_s)) AS due
          FROM {schema}.stage WHERE job = %(job)s AND part = ANY(%(parts)b::bigint[])
          ORDER BY sid) s
    ON CONFLICT (topic, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING topic, available_at
), woke AS (
    SELECT {schema}.wake(topic, count(*)) AS woke
    FROM sent WHERE available_at <= statement_timestamp() GROUP BY topic
)
SELECT (SELECT count(*) FROM sent) AS n, (SELECT bool_or(woke) FROM woke) AS woke;

-- name: stage_publish_replace :one
-- The last staged row of a key wins; ON CONFLICT may touch each live row only once.
WITH sent AS (
    INSERT INTO {schema}.message (topic, key, kind, payload, payload_bytes, headers, priority,
                                  created_at, available_at, first_available_at)
    SELECT s.topic, s.key, s.kind, s.payload, s.payload_bytes, s.headers, s.priority,
           statement_timestamp(), GREATEST(s.due, statement_timestamp()), s.due
    FROM (SELECT *, COALESCE(at, statement_timestamp() + make_interval(secs => delay_s)) AS due,
                 row_number() OVER (PARTITION BY topic, key ORDER BY sid DESC) AS nth
          FROM {schema}.stage WHERE job = %(job)s AND part = ANY(%(parts)b::bigint[])) s
    WHERE s.key IS NULL OR s.nth = 1
    ORDER BY s.sid
    ON CONFLICT (topic, key) WHERE key IS NOT NULL DO UPDATE SET
        kind = EXCLUDED.kind, payload = EXCLUDED.payload, payload_bytes = EXCLUDED.payload_bytes,
        headers = EXCLUDED.headers, priority = EXCLUDED.priority, attempts = 0, lease = NULL,
        last_error = NULL, progress = NULL, received_at = NULL,
        available_at = EXCLUDED.available_at, first_available_at = EXCLUDED.first_available_at
    RETURNING topic, available_at
), woke AS (
    SELECT {schema}.wake(topic, count(*)) AS woke
    FROM sent WHERE available_at <= statement_timestamp() GROUP BY topic
)
SELECT (SELECT count(*) FROM sent) AS n, (SELECT bool_or(woke) FROM woke) AS woke;

-- name: stage_count :one
SELECT count(*) AS n FROM {schema}.stage WHERE job = %(job)s AND part = ANY(%(parts)b::bigint[]);

-- name: stage_delete_job :exec
DELETE FROM {schema}.stage WHERE job = %(job)s;

-- name: stage_stale_jobs :many
SELECT job FROM {schema}.load_job
WHERE state = 'open' AND created_at <= statement_timestamp() - make_interval(secs => %(older_than_s)s);

-- name: history_bounds_live :one
SELECT min(id) AS lo, max(id) AS hi FROM {schema}.message
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s);

-- name: history_rows_live :many
-- Live messages by id range, for snapshots (the lease column is left to the caller).
SELECT * FROM {schema}.message
WHERE id BETWEEN %(lo)s AND %(hi)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s)
  AND (load_part IS NULL OR load_part NOT IN (SELECT id FROM {schema}.load_part WHERE state = 'open'))
ORDER BY id;

-- name: history_bounds_dead :one
SELECT min(id) AS lo, max(id) AS hi FROM {schema}.dead
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s);

-- name: history_bounds_done :one
SELECT min(id) AS lo, max(id) AS hi FROM {schema}.done
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s);

-- name: history_rows_dead :many
SELECT * FROM {schema}.dead
WHERE id BETWEEN %(lo)s AND %(hi)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(before)s::timestamptz IS NULL OR dead_at < %(before)s)
ORDER BY id;

-- name: history_rows_done :many
SELECT * FROM {schema}.done
WHERE id BETWEEN %(lo)s AND %(hi)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(before)s::timestamptz IS NULL OR done_at < %(before)s)
ORDER BY id;

-- name: history_delete_dead :exec
DELETE FROM {schema}.dead WHERE id = ANY(%(ids)b::bigint[])
  AND (%(before)s::timestamptz IS NULL OR dead_at < %(before)s);

-- name: history_delete_done :exec
DELETE FROM {schema}.done WHERE id = ANY(%(ids)b::bigint[])
  AND (%(before)s::timestamptz IS NULL OR done_at < %(before)s);

-- --- tableq doctor: read-only facts about the server (judged in tableq.doctor) ---------------

-- name: doctor_durability :one
-- What decides whether a commit that was acknowledged survives a crash of the server or of
-- the machine.
SELECT current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('full_page_writes') AS full_page_writes;

-- name: doctor_sees_all_sessions :one
-- Without pg_read_all_stats (or superuser), other users' sessions show no transaction times.
SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS sees_all;

-- name: doctor_old_transactions :many
-- Open transactions of this database that hold a snapshot or a transaction id: while they
-- last, vacuum keeps every row deleted after they began (acked messages included). Oldest
-- first; this session is left out.
SELECT pid, usename AS user_name, application_name, client_addr::text AS client, state,
       extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_s,
       age(backend_xmin) AS xmin_age
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_type = 'client backend' AND xact_start IS NOT NULL
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
ORDER BY xact_start
LIMIT 5;

-- name: doctor_prepared_transactions :one
-- A forgotten prepared transaction (two-phase commit) holds back cleanup like an open one.
SELECT count(*) AS n,
       extract(epoch FROM clock_timestamp() - min(prepared))::float8 AS oldest_s,
       min(gid) AS gid
FROM pg_prepared_xacts
WHERE database = current_database();

-- name: doctor_replication_slots :many
-- A slot that pins xmin (a standby with hot_standby_feedback) holds back cleanup too, and
-- forever once its standby is gone.
SELECT slot_name, active, age(xmin) AS xmin_age
FROM pg_replication_slots
WHERE xmin IS NOT NULL;

-- name: doctor_dead_rows :many
-- Dead row versions left on tableq's tables (estimates from the statistics collector).
SELECT relname AS table_name, n_live_tup AS live_rows, n_dead_tup AS dead_rows,
       extract(epoch FROM clock_timestamp() - greatest(last_autovacuum, last_vacuum))::float8
           AS vacuumed_s_ago
FROM pg_stat_user_tables
WHERE schemaname = %(schema)s
ORDER BY n_dead_tup DESC, relname;

-- name: doctor_size :one
-- The message table's file against what its rows take, from the catalog alone (pg_class, as
-- the last VACUUM or ANALYZE left it: no lock on the table, so a VACUUM FULL cannot hold this
-- up): its pages and rows (-1 before the first VACUUM or ANALYZE), its indexes' pages, and
-- the rows' mean width (pg_stats, NULL before an ANALYZE) plus a row's own 28 bytes of header
-- and line pointer. No row while the table does not exist.
SELECT c.relpages::bigint * current_setting('block_size')::bigint AS heap_bytes,
       (SELECT coalesce(sum(i.relpages), 0) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = c.oid)::bigint * current_setting('block_size')::bigint AS index_bytes,
       c.reltuples::bigint AS live_rows,
       (SELECT sum(avg_width) + 28 FROM pg_stats
        WHERE schemaname = %(schema)s AND tablename = 'message')::bigint AS row_bytes
FROM pg_class c
WHERE c.oid = to_regclass('{schema}.message');

-- --- access tokens and idempotency records of the HTTP server ------------------------------

-- name: token_insert :exec
INSERT INTO {schema}.token (id, secret_sha256, role, topics, name, access_key, sqs_secret,
                            expires_at)
VALUES (%(id)s, %(secret_sha256)s, %(role)s, %(topics)s::jsonb, %(name)s, %(access_key)s,
        %(sqs_secret)s,
        statement_timestamp() + make_interval(secs => %(expires_in_s)s::double precision));

-- name: token_by_secret :one
SELECT *, statement_timestamp() AS db_now FROM {schema}.token
WHERE secret_sha256 = %(secret_sha256)s;

-- name: token_by_access_key :one
SELECT *, statement_timestamp() AS db_now FROM {schema}.token WHERE access_key = %(access_key)s;

-- name: token_list :many
SELECT *, statement_timestamp() AS db_now FROM {schema}.token ORDER BY created_at, id;

-- name: token_revoke :exec
UPDATE {schema}.token SET revoked_at = statement_timestamp()
WHERE id = %(id)s AND revoked_at IS NULL;

-- name: idempotency_claim :exec
-- Inside the send's transaction: a concurrent request with the same key waits here until
-- this transaction ends, then finds the committed record (or inserts, if this one rolled back).
INSERT INTO {schema}.idempotency (token_id, idem_key, fingerprint, status)
VALUES (%(token_id)s, %(idem_key)s, %(fingerprint)s, 0)
ON CONFLICT (token_id, idem_key) DO NOTHING;

-- name: idempotency_get :one
SELECT fingerprint, status, response FROM {schema}.idempotency
WHERE token_id = %(token_id)s AND idem_key = %(idem_key)s;

-- name: idempotency_finish :exec
UPDATE {schema}.idempotency SET status = %(status)s, response = %(response)s
WHERE token_id = %(token_id)s AND idem_key = %(idem_key)s;

-- name: idempotency_expire :exec
DELETE FROM {schema}.idempotency
WHERE created_at < statement_timestamp() - make_interval(secs => %(older_than_s)s);
