-- Claim floors: what a claim needs to know about the database's other transactions
-- (backends/postgres/floors.py).
--
-- While any snapshot is held open (a REPEATABLE READ report, a long statement, a replication
-- slot's xmin), no dead row version of the message table can be removed, and a claim that
-- reads its topic from the start of the claim index walks every message received since. A
-- claim may start from a floor instead: a position before which no live message can sort.
-- The floor comes from the claim before (the first row it could see), capped by this
-- function's oldest_write: every message a transaction still in flight may yet make visible
-- is due no earlier than that transaction's start (tableq's statements never write a due
-- time before their own start), or the start of a statement that waits for a lock.
--
--   hidden:          a session of this database whose transactions this role cannot see
--                    (it needs pg_read_all_stats): then no floor is safe.
--   oldest_snapshot: the start of the oldest transaction holding a snapshot; the year 1 when a
--                    replication slot holds back cleanup.
--   oldest_write:    the earliest due time a write in flight may have; the year 1 while a
--                    prepared transaction waits (its start is not known).
-- plpgsql, not sql: it keeps its plan for the session (a SQL function with OUT parameters is
-- planned at every call, about 2 ms here).
CREATE FUNCTION {schema}.horizon(OUT hidden boolean, OUT oldest_snapshot timestamptz,
                                 OUT oldest_write timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT bool_or(a.state IS NULL),
           LEAST(min(a.xact_start) FILTER (WHERE a.backend_xmin IS NOT NULL),
                 (SELECT '0001-01-01 00:00:00+00'::timestamptz FROM pg_replication_slots
                  WHERE xmin IS NOT NULL LIMIT 1)),
           LEAST(min(a.xact_start) FILTER (WHERE a.backend_xid IS NOT NULL),
                 min(a.query_start) FILTER (WHERE a.wait_event_type = 'Lock'),
                 (SELECT '0001-01-01 00:00:00+00'::timestamptz FROM pg_prepared_xacts
                  WHERE database = current_database() LIMIT 1))
    INTO hidden, oldest_snapshot, oldest_write
    FROM pg_stat_activity a
    -- Another role's session shows no state, start or type to a role without the right.
    WHERE a.datname = current_database()
      AND COALESCE(a.backend_type, 'client backend') = 'client backend';
END $$;
