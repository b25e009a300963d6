-- Only keyed messages need an entry in the (topic, key) index: as on PostgreSQL, it is a
-- partial index, so an unkeyed send (most of them) writes one index entry less (SQLite NORMAL
-- single inserts into the message table: about 20k -> 26k a second on this machine).
DROP INDEX {p}message_topic_key;
CREATE UNIQUE INDEX {p}message_topic_key ON {p}message (topic, key) WHERE key IS NOT NULL;
