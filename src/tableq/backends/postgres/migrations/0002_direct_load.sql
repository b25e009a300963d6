-- Direct bulk loads: unkeyed rows of a staged load are copied straight into the message
-- table, tagged with their load part, and stay invisible while that part is open. Publishing
-- flips one load_part row per task instead of moving every row, so a commit costs O(parts).
-- Keyed rows still go through the stage table, where publish can arbitrate duplicates.
CREATE TABLE {schema}.load_part (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job text NOT NULL,
    part bigint NOT NULL,
    topic text NOT NULL,
    state text NOT NULL,  -- open | published | dropped
    rows bigint NOT NULL,
    UNIQUE (job, part, topic)
);
-- Readers exclude rows of open parts: `load_part NOT IN (SELECT id ... WHERE state = 'open')`
-- builds one small hash from this index per statement.
CREATE INDEX load_part_open ON {schema}.load_part (id) WHERE state = 'open';

-- Not indexed: an index cost about a tenth of a bulk load's server time, and only dropping
-- the rows of a failed task attempt or an aborted load (rare) looks rows up by load part;
-- that walks the topic's part of the claim index instead.
ALTER TABLE {schema}.message ADD COLUMN load_part bigint;
-- COPY cannot compute values, so an undelayed loaded row takes its due time from the server.
ALTER TABLE {schema}.message ALTER COLUMN available_at SET DEFAULT statement_timestamp(),
    ALTER COLUMN first_available_at SET DEFAULT statement_timestamp();

-- Loaded rows wake nobody when copied; publish notifies once per topic instead.
CREATE OR REPLACE FUNCTION {schema}.notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_wake',
                      json_build_object('topic', n.topic, 'n', n.count)::text)
    FROM (SELECT topic, count(*) AS count FROM new_rows
          WHERE available_at <= statement_timestamp() AND load_part IS NULL
          GROUP BY topic) n;
    RETURN NULL;
END $$;
