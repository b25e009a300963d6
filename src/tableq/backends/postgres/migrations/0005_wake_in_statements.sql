-- Sends wake listeners from their own statements, not from a trigger.
--
-- The insert trigger (0001, 0004) ran a query over its transition table on every INSERT: a
-- single send paid for the transition table, the trigger call and that query. Measured with
-- pgbench on 2 cores, one row per INSERT: the trigger took 8-20% of the insert rate, a call
-- of the function below from the statement itself 3-6%; through send() in Python, 0.79x ->
-- 0.84x of a raw INSERT loop (the trigger dropped altogether: 0.86x).
--
-- Every statement of queries.sql that puts rows due now into the message table calls
-- {schema}.wake(topic, n) once per topic it sent to (COPY, which cannot, is followed by
-- wake_topics). The rules are 0004's, unchanged:
--
--   waiting:  a listener holds (hashtext(schema || '_wake_wait'), hashtext(topic)) in shared
--             mode, at session level, while it waits; topic '' (ANY_TOPIC) waits for all.
--   sending:  a send of due messages holds (hashtext(schema || '_wake_send'), hashtext(topic))
--             and the same for '' in shared mode until its transaction ends, then notifies if
--             an exclusive try of the topic's (or '')'s wait lock fails.
--
-- Rows written by other means (SQL of one's own, a tableq older than this migration) wake
-- nobody: workers find them at their next look (a listening worker looks every 2 s at most).
-- {schema_name} is the schema's name as a string literal (the keys and the channel use the
-- bare name). Assignments and IF conditions are plpgsql's simple expressions, much cheaper
-- than PERFORM.
CREATE OR REPLACE FUNCTION {schema}.wake(topic text, n bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    send_key integer := hashtext({schema_name} || '_wake_send');
    wait_key integer := hashtext({schema_name} || '_wake_wait');
    every_topic integer := hashtext('');
    topic_key integer := hashtext(topic);
    done text;
BEGIN
    done := pg_advisory_xact_lock_shared(send_key, topic_key)::text
            || pg_advisory_xact_lock_shared(send_key, every_topic)::text;
    IF pg_try_advisory_lock(wait_key, topic_key) THEN  -- nobody waits for this topic
        done := pg_advisory_unlock(wait_key, topic_key)::text;
        IF pg_try_advisory_lock(wait_key, every_topic) THEN  -- nor for every topic
            done := pg_advisory_unlock(wait_key, every_topic)::text;
            RETURN false;
        END IF;
    END IF;
    PERFORM pg_notify({schema_name} || '_wake', json_build_object('topic', topic, 'n', n)::text);
    RETURN true;
END $$;

DROP TRIGGER IF EXISTS message_notify_due ON {schema}.message;
DROP FUNCTION IF EXISTS {schema}.notify_due();
