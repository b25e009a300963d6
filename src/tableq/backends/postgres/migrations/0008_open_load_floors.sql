-- Claims pass over open bulk loads from a floor (backends/postgres/floors.py).
--
-- The rows of an open load part sit in the claim index where they were copied, before every
-- message sent to their topic after them, and a claim that reads the topic from its start
-- walks all of them (500,000 open rows made a receive of one message 147 times slower). A
-- floor may now pass over them, as it passes over dead row versions, for as long as they stay
-- unpublished: once a part is published its rows are due where they sit, before any floor.
--
-- load_published counts the publishes of each topic's parts. The count moves in commit order
-- (each publish updates the topic's row, so two publishes of one topic take turns), so a claim
-- that reads a count no higher than the one its floor was learned under knows that no part of
-- the topic has been published since; otherwise it reads the topic from the start again.
CREATE TABLE {schema}.load_published (
    topic text PRIMARY KEY,
    n bigint NOT NULL
);

-- Counted by a trigger, whoever flips a part from open to published (a client of an older
-- version too, or SQL by hand), once per topic per statement, the topics' rows locked in
-- sorted order (two publishes over the same topics cannot deadlock on them).
CREATE FUNCTION {schema}.load_published_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.load_published AS p (topic, n)
    SELECT DISTINCT n.topic, 1 FROM new_parts n JOIN old_parts o ON o.id = n.id
    WHERE o.state = 'open' AND n.state = 'published'
    ORDER BY 1
    ON CONFLICT (topic) DO UPDATE SET n = p.n + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER load_part_published AFTER UPDATE ON {schema}.load_part
    REFERENCING OLD TABLE AS old_parts NEW TABLE AS new_parts
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.load_published_count();

-- horizon() also names the topics with open load parts: a process claims those from floors
-- even while no snapshot is held. 0006's function keeps its work under a name of its own.
ALTER FUNCTION {schema}.horizon() RENAME TO transactions_horizon;
CREATE FUNCTION {schema}.horizon(OUT hidden boolean, OUT oldest_snapshot timestamptz,
                                 OUT oldest_write timestamptz, OUT open_topics text[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT t.hidden, t.oldest_snapshot, t.oldest_write INTO hidden, oldest_snapshot, oldest_write
    FROM {schema}.transactions_horizon() t;
    open_topics := ARRAY(SELECT DISTINCT topic FROM {schema}.load_part WHERE state = 'open');
END $$;
