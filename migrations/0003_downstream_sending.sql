-- Sending the outbox (issue 4): per-row delivery state, leases for several workers, bad
-- and replaced tokens, and a NOTIFY that wakes the sender when rows are inserted.
--
-- A row may be claimed when available_at <= now(): at insert time for new rows, at the
-- next attempt for retries, and when the claiming worker's lease runs out for rows it
-- claimed (so a crashed worker's rows are taken over). available_at is NULL once the row
-- is final (acked, delivered, failed, expired).
ALTER TABLE downstream_messages
    ADD COLUMN available_at      timestamptz DEFAULT now(),
    ADD COLUMN attempts          integer NOT NULL DEFAULT 0,   -- times sent to FCM
    ADD COLUMN claimed_by        text,                          -- the worker that claimed it last
    ADD COLUMN sent_on           text,                          -- the connection it was last sent on
    ADD COLUMN sent_at           timestamptz,
    ADD COLUMN acked_at          timestamptz,
    ADD COLUMN delivered_at      timestamptz,                   -- from the delivery receipt
    ADD COLUMN error_code        text,                          -- the last nack or refusal
    ADD COLUMN error_description text,
    ADD COLUMN canonical_token   text,                          -- registration_id FCM answered with
    ADD CONSTRAINT downstream_messages_status CHECK
        (status IN ('pending', 'sending', 'sent', 'acked', 'delivered', 'failed', 'retry', 'expired'));

DROP INDEX downstream_messages_pending;
CREATE INDEX downstream_messages_claimable ON downstream_messages (available_at, id) WHERE available_at IS NOT NULL;

-- Tokens FCM refused or replaced. Messages to an invalid or unregistered token fail
-- without being sent; messages to a replaced token go to its canonical token.
CREATE TABLE device_tokens (
    token           text PRIMARY KEY,
    state           text NOT NULL CHECK (state IN ('invalid', 'unregistered', 'replaced')),
    canonical_token text,
    error_code      text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'replaced') = (canonical_token IS NOT NULL))
);

CREATE FUNCTION fcm_downstream_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fcm_downstream', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER downstream_messages_notify AFTER INSERT ON downstream_messages
    FOR EACH STATEMENT EXECUTE FUNCTION fcm_downstream_notify();
