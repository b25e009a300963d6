-- The claim index becomes partial on `available_at IS NOT NULL` (every row: the column is NOT
-- NULL), so that only statements naming available_at in a comparison can use it. A statement
-- that finds rows by id then has one index to choose: the primary key.
--
-- Why: while a snapshot is held, the table fills with dead row versions that no vacuum may
-- remove, and once the queue is drained, VACUUM and ANALYZE record reltuples = 0. The planner
-- then costs every scan of message as one row: an ack or a claim's UPDATE by id read the
-- whole claim index (id is its last column) or the whole primary key, seconds per statement
-- at a few million dead versions. With this index, and the statements' `id = ANY(...)`
-- restrictions (queries.sql), a lookup by id stays a lookup whatever the statistics say.
--
CREATE INDEX message_claim_due ON {schema}.message (topic, priority DESC, available_at, id)
    WHERE available_at IS NOT NULL;
DROP INDEX {schema}.message_claim;
ALTER INDEX {schema}.message_claim_due RENAME TO message_claim;
