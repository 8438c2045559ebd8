-- A claim locks the outbox before its id sequence, in the order TRUNCATE … RESTART IDENTITY
-- takes them. A claim read the sequence (fcm_outbox_sequence_top) before its first statement
-- on downstream_messages; a TRUNCATE … RESTART IDENTITY that came between the two held the
-- table and waited for the sequence while the claim held the sequence and waited for the
-- table, and PostgreSQL ended one of them with "deadlock detected" (40P01): an operator's
-- TRUNCATE failed while a worker was sending. Now the claim waits for the TRUNCATE, or the
-- TRUNCATE for the claim's transaction, and both go through.
CREATE OR REPLACE FUNCTION fcm_outbox_sequence_top() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- An ACCESS SHARE lock on the table, held to the end of the transaction, before the
    -- sequence's.
    PERFORM FROM downstream_messages LIMIT 0;
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM downstream_messages_id_seq AS s);
END
$$;
