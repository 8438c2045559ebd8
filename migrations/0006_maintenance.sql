-- What `fcm-worker dead-letters replay` and `fcm-worker prune` need: when a dead letter was
-- replayed, and indexes for deleting old rows in small batches without a sequential scan.
ALTER TABLE dead_letters ADD COLUMN replayed_at timestamptz;
CREATE INDEX dead_letters_created_at ON dead_letters (created_at);
CREATE INDEX processed_upstream_processed_at ON processed_upstream (processed_at);
-- Finished outbox rows (acked, delivered, failed, expired) are those no worker will claim.
CREATE INDEX downstream_messages_finished ON downstream_messages (created_at) WHERE available_at IS NULL;
