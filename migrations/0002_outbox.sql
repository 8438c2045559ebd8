-- The outbox: a row per downstream message to send. Handlers' reply/send write rows in their
-- own transaction; any other SQL client may insert rows too. Sending is the sender's job.
CREATE TABLE downstream_messages (
    id                bigserial PRIMARY KEY,
    target            text,          -- registration token, notification key or /topics/NAME
    condition         text,          -- topic condition, instead of target
    payload           jsonb NOT NULL DEFAULT '{}'::jsonb,  -- data, notification and options
    status            text NOT NULL DEFAULT 'pending',
    source_message_id text,          -- the upstream message that caused it, if any
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((target IS NULL) <> (condition IS NULL))
);
CREATE INDEX downstream_messages_pending ON downstream_messages (id) WHERE status = 'pending';
