-- Upstream messages as the built-in `store` handler keeps them: one row per message_id.
CREATE TABLE upstream_messages (
    id          bigserial PRIMARY KEY,
    message_id  text NOT NULL UNIQUE,
    from_token  text NOT NULL,
    category    text,
    data        jsonb NOT NULL DEFAULT '{}'::jsonb,
    received_at timestamptz NOT NULL
);
CREATE INDEX upstream_messages_from_token ON upstream_messages (from_token, received_at);

-- Exactly-once effects: the de-duplication record of every upstream message whose handlers
-- committed (or that was dead-lettered), written in the same transaction as their effects.
-- Old rows may be pruned once CCS can no longer redeliver them (days, not weeks).
CREATE TABLE processed_upstream (
    message_id   text PRIMARY KEY,
    outcome      text NOT NULL DEFAULT 'handled' CHECK (outcome IN ('handled', 'dead_lettered')),
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- Messages no handler could take: unackable ones (no message_id or from), unreadable ones
-- (bad JSON), and those whose handlers kept failing. The raw payload is kept as received.
CREATE TABLE dead_letters (
    id          bigserial PRIMARY KEY,
    message_id  text,
    from_token  text,
    category    text,
    raw_payload text NOT NULL,
    reason      text NOT NULL CHECK (reason IN ('unackable', 'unreadable', 'handler_failed')),
    error       text,
    attempts    integer NOT NULL DEFAULT 0,
    received_at timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
