-- The open rows' queueing time, for the age of the oldest row not yet answered (pending,
-- retry or sending), whatever its due time: rows held back with a future due time (a quota
-- pause, credentials that cannot send) kept the due age near zero while they waited.
-- A column added at the end: the view's other columns and its readers are unchanged.
CREATE OR REPLACE VIEW downstream_messages_open_shown AS
    SELECT d.id, d.transport, d.available_at,
           CASE WHEN f.id IS NULL OR d.status = 'sent' OR d.available_at IS NULL THEN d.status ELSE 'sending' END AS status,
           f.id IS NULL AND d.available_at <= now() AS due,
           d.created_at
    FROM downstream_messages_open AS o
         -- OFFSET 0: not pulled up into a join that could read the whole outbox.
         CROSS JOIN LATERAL (SELECT x.* FROM downstream_messages AS x WHERE x.id = o.id OFFSET 0) AS d
         LEFT JOIN downstream_messages_in_flight AS f ON f.id = d.id;
