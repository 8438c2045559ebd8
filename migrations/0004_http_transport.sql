-- The legacy HTTP protocol beside XMPP (issue 5). A row goes over HTTP when its transport
-- is 'http'; a row with several tokens (registration_ids) always does, as a multicast.
-- token_results keeps each token's outcome: {"TOKEN": {"message_id": …} | {"error": …}, …}.
ALTER TABLE downstream_messages
    ADD COLUMN registration_ids text[],
    ADD COLUMN transport        text NOT NULL DEFAULT 'xmpp' CHECK (transport IN ('xmpp', 'http')),
    ADD COLUMN token_results    jsonb;

ALTER TABLE downstream_messages DROP CONSTRAINT downstream_messages_check;
ALTER TABLE downstream_messages ADD CONSTRAINT downstream_messages_one_target
    CHECK (num_nonnulls(target, condition, registration_ids) = 1);
ALTER TABLE downstream_messages ADD CONSTRAINT downstream_messages_multicast_over_http
    CHECK (registration_ids IS NULL OR transport = 'http');

CREATE FUNCTION fcm_downstream_transport() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.registration_ids IS NOT NULL THEN
        NEW.transport := 'http';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER downstream_messages_transport BEFORE INSERT ON downstream_messages
    FOR EACH ROW EXECUTE FUNCTION fcm_downstream_transport();

DROP INDEX downstream_messages_claimable;
CREATE INDEX downstream_messages_claimable ON downstream_messages (transport, available_at, id)
    WHERE available_at IS NOT NULL;

-- Device groups created through the worker: name → FCM's notification key and tokens.
CREATE TABLE device_groups (
    name             text PRIMARY KEY,
    notification_key text NOT NULL UNIQUE,
    tokens           text[] NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
