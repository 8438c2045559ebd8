-- FCM's HTTP v1 API as a third transport: rows with transport 'v1' are sent with a service
-- account over HTTP/2. A multicast row (registration_ids) may go over v1 (one request per
-- token, each token's answer in token_results); the insert trigger turns only an 'xmpp'
-- multicast to 'http', as before. The v1 message name FCM returns is kept in token_results
-- ({"TARGET": {"name": "projects/…/messages/…"}}).
--
-- The constraints are replaced NOT VALID and then validated: the table stays writable
-- while its rows are checked.
ALTER TABLE downstream_messages DROP CONSTRAINT downstream_messages_transport_check;
ALTER TABLE downstream_messages ADD CONSTRAINT downstream_messages_transport_check
    CHECK (transport IN ('xmpp', 'http', 'v1')) NOT VALID;
ALTER TABLE downstream_messages DROP CONSTRAINT downstream_messages_multicast_over_http;
ALTER TABLE downstream_messages ADD CONSTRAINT downstream_messages_multicast_over_http
    CHECK (registration_ids IS NULL OR transport IN ('http', 'v1')) NOT VALID;
ALTER TABLE downstream_messages VALIDATE CONSTRAINT downstream_messages_transport_check;
ALTER TABLE downstream_messages VALIDATE CONSTRAINT downstream_messages_multicast_over_http;

CREATE OR REPLACE FUNCTION fcm_downstream_transport() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.registration_ids IS NOT NULL AND NEW.transport = 'xmpp' THEN
        NEW.transport := 'http';
    END IF;
    IF NEW.status = 'pending' OR NEW.status = 'retry' THEN
        NEW.available_at := coalesce(NEW.available_at, now());
    ELSE
        NEW.available_at := NULL;
    END IF;
    RETURN NEW;
END
$$;

-- The v1 claims' cursor. No row had transport 'v1' before: its frontier starts at 0, and
-- its first claim reads the (empty) v1 part of the index from there.
ALTER TABLE outbox_cursors DROP CONSTRAINT outbox_cursors_transport_check;
ALTER TABLE outbox_cursors ADD CONSTRAINT outbox_cursors_transport_check CHECK (transport IN ('xmpp', 'http', 'v1'));
INSERT INTO outbox_cursors (transport, frontier) VALUES ('v1', 0);
