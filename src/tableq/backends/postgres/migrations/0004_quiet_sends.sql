-- Sends notify only when a listener waits for their topic.
--
-- A NOTIFY is not free: PostgreSQL commits notifying transactions one at a time (a global
-- lock, held through the commit's WAL flush, keeps the notification queue in commit order),
-- so concurrent senders that notify cannot share a flush. Measured on 2 cores with 4
-- producers: INSERT + pg_notify ran at 0.57x of the same INSERT alone. A worker draining a
-- backlog, or no worker at all, needs no wake-up; only a listener that waits does.
--
-- Listeners say they wait with advisory locks, which every snapshot sees alike (a REPEATABLE
-- READ outbox transaction could not see a fresh row in a table) and which go with the session:
--
--   waiting:  a listener holds (hashtext(schema || '_wake_wait'), hashtext(topic)) in shared
--             mode, at session level, while it waits; topic '' (ANY_TOPIC) waits for all.
--   sending:  a send of due messages holds (hashtext(schema || '_wake_send'), hashtext(topic))
--             and the same for '' in shared mode until its transaction ends, then notifies if
--             an exclusive try of the topic's (or '')'s wait lock fails.
--
-- A listener that registers tries the send lock of each of its topics exclusively, and looks
-- for work again once that succeeds: a send that looked before the listener registered either
-- holds the send lock (the listener waits for it to end) or has committed (the look sees it).
-- A send that looks after the registration sees it and notifies. Senders never wait on any of
-- these locks. Two senders probing the same wait lock at the same instant make one of them
-- notify, which is only a wasted wake-up.
-- Assignments and IF conditions below are plpgsql's simple expressions, much cheaper than a
-- PERFORM (a whole query): they run once per statement and topic on every send.
CREATE OR REPLACE FUNCTION {schema}.notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    due record;
    send_key integer := hashtext(TG_TABLE_SCHEMA || '_wake_send');
    wait_key integer := hashtext(TG_TABLE_SCHEMA || '_wake_wait');
    every_topic integer := hashtext('');
    topic_key integer;
    done text;
BEGIN
    FOR due IN SELECT topic, count(*) AS n FROM new_rows
               WHERE available_at <= statement_timestamp() AND load_part IS NULL
               GROUP BY topic LOOP
        topic_key := hashtext(due.topic);
        done := pg_advisory_xact_lock_shared(send_key, topic_key)::text
                || pg_advisory_xact_lock_shared(send_key, every_topic)::text;
        IF pg_try_advisory_lock(wait_key, topic_key) THEN  -- nobody waits for this topic
            done := pg_advisory_unlock(wait_key, topic_key)::text;
            IF pg_try_advisory_lock(wait_key, every_topic) THEN  -- nor for every topic
                done := pg_advisory_unlock(wait_key, every_topic)::text;
                CONTINUE;
            END IF;
        END IF;
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_wake',
                          json_build_object('topic', due.topic, 'n', due.n)::text);
    END LOOP;
    RETURN NULL;
END $$;
