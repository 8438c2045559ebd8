-- A message of a message_type CCS did not document is acked and kept here once (it was
-- never acked before, so CCS redelivered it forever).
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_reason_check;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_reason_check
    CHECK (reason IN ('unackable', 'unreadable', 'unknown_type', 'handler_failed'));
