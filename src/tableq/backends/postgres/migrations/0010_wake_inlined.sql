-- wake() as one SQL expression that the planner inlines into the statement that calls it,
-- instead of a PL/pgSQL function. Same locks, same order, same rules (0004, 0005).
--
-- Why: every send of a message due now calls wake(). Measured on the shared server with
-- 2026-11-29's build, one connection, 8 alternating rounds of 4,000 `SELECT wake(...)` with
-- nobody waiting, the server's CPU per call (the backend process's own time): a bare
-- `SELECT` 56 us, the PL/pgSQL wake() 81 us, this one 60 us; a PL/pgSQL function that only
-- hashes its argument already cost 66 us. Most of a send's wake-up was the PL/pgSQL call
-- itself, not its advisory locks.
--
-- The order of the steps is CASE's, which evaluates its WHEN conditions one after another
-- and stops at the first true one:
--   1. both send locks, shared, until the transaction ends (void casts to '', so this WHEN is
--      never true: it only takes the locks before anything else is looked at);
--   2. a listener waits for this topic (its wait lock cannot be tried exclusively): notify;
--   3. (never true) give back the wait lock just tried;
--   4. a listener waits for every topic: notify;
--   5. nobody waits: give back that lock too and return false.
-- The keys' hashtext() of constants is folded once, when the calling statement is planned.
CREATE OR REPLACE FUNCTION {schema}.wake(topic text, n bigint) RETURNS boolean
LANGUAGE sql AS $$
SELECT CASE
    WHEN (pg_advisory_xact_lock_shared(hashtext({schema_name} || '_wake_send'), hashtext(topic))::text
          || pg_advisory_xact_lock_shared(hashtext({schema_name} || '_wake_send'), hashtext(''))::text)
         <> ''
        THEN NULL
    WHEN NOT pg_try_advisory_lock(hashtext({schema_name} || '_wake_wait'), hashtext(topic))
        THEN pg_notify({schema_name} || '_wake',
                       json_build_object('topic', topic, 'n', n)::text)::text = ''
    WHEN NOT pg_advisory_unlock(hashtext({schema_name} || '_wake_wait'), hashtext(topic))
        THEN NULL
    WHEN NOT pg_try_advisory_lock(hashtext({schema_name} || '_wake_wait'), hashtext(''))
        THEN pg_notify({schema_name} || '_wake',
                       json_build_object('topic', topic, 'n', n)::text)::text = ''
    ELSE NOT pg_advisory_unlock(hashtext({schema_name} || '_wake_wait'), hashtext(''))
END
$$;
