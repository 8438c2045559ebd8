-- Claims per batch rather than per row (issue 16). A claim was two row updates per message
-- (the claim, then the answer), each a new row version with index entries; now a claim is
-- one row of outbox_claims naming a batch of rows, and a message's row is updated once, when
-- its answer is written. Measured in PL/pgSQL loops of 100-row transactions (one backend):
-- claim + answer 47-49 us a row before, 15-17 us after, one final-status update alone 16-18.
--
-- How rows are found without touching them:
-- * outbox_cursors keeps, per transport, a frontier: every row with a larger id is new to the
--   claims. A claim takes due rows above it in id order and moves it to the last one taken.
-- * Ids are handed out before their transactions commit, so a claim can pass an id whose row
--   is not visible yet. Such ids are kept as gaps, each with the snapshot's xmax when it was
--   first seen (among the last 2,000 ids a claim passes); a later claim takes a gap's row
--   once it is visible, and forgets the gap once every transaction that was running then
--   has ended (it was rolled back), or after 10 s (a row that commits later still is found
--   by the sweep).
-- * Everything at or below the frontier that is due again (a retry, a row handed back, a
--   row of a claim that expired) is found by the sweep, which the senders run every
--   sweep interval and when a retry falls due: due rows not named by a live claim.
-- * A claim lives until every row of it is answered and written (the write-back deletes it
--   in the same transaction) or until it expires: the worker renews it every third of the
--   lease; the sweep of any worker deletes expired claims and so takes their rows over.
-- * Claims and sweeps of a transport run one at a time (an advisory lock per schema and
--   transport), so
--   no two claims name the same row; a write-back holds its claims FOR SHARE, so a takeover
--   waits for it and a write after a takeover changes nothing.
--
-- What readers of the table see: a row keeps its status (pending, or retry) while it is in
-- flight; claimed_by, sent_on, sent_at and attempts are written with its answer (or, for a
-- message unanswered after a second, with status 'sent'). Rows in flight are those named by
-- outbox_claims (the view downstream_messages_in_flight; `fcm-worker status` and the metrics
-- show them as 'sending', as before: the view downstream_messages_shown). 'sending' is no longer written.
CREATE TABLE outbox_claims (
    id         bigserial PRIMARY KEY,
    worker     text NOT NULL,
    transport  text NOT NULL,
    row_ids    bigint[] NOT NULL,
    first_id   bigint NOT NULL,
    last_id    bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX outbox_claims_by_range ON outbox_claims (transport, first_id, last_id);

CREATE TABLE outbox_cursors (
    transport text PRIMARY KEY CHECK (transport IN ('xmpp', 'http')),
    frontier  bigint NOT NULL,
    gap_ids   bigint[] NOT NULL DEFAULT '{}',
    gap_xmax  xid8[] NOT NULL DEFAULT '{}',
    gap_seen  timestamptz[] NOT NULL DEFAULT '{}'
);
-- Rows claimed by workers before this migration keep their per-row lease in available_at:
-- the first claims pass them while they are not due, and the sweep takes them once due.
INSERT INTO outbox_cursors (transport, frontier)
SELECT t, coalesce((SELECT min(id) - 1 FROM downstream_messages WHERE available_at IS NOT NULL),
                   (SELECT max(id) FROM downstream_messages), 0)
FROM unnest(ARRAY['xmpp', 'http']) AS t;

-- The claims' path: unfinished rows by id. It replaces the claimable index (by due time),
-- which no claim uses any more: one index fewer to write at every insert and retry.
CREATE INDEX downstream_messages_unfinished ON downstream_messages (transport, id) WHERE available_at IS NOT NULL;
DROP INDEX downstream_messages_claimable;

-- The rows in flight: named by a live claim (status and metrics show them as 'sending').
CREATE VIEW downstream_messages_in_flight AS
    SELECT r.id, c.id AS claim_id, c.worker, c.expires_at
    FROM outbox_claims AS c CROSS JOIN LATERAL unnest(c.row_ids) AS r(id)
    WHERE c.expires_at > now();

-- Every row as `fcm-worker status` and the metrics show it: a pending or retry row in
-- flight as 'sending'; due: waiting for a claim now (not in flight, its time come).
CREATE VIEW downstream_messages_shown AS
    SELECT d.id, d.transport, d.available_at,
           CASE WHEN f.id IS NULL OR d.status = 'sent' OR d.available_at IS NULL THEN d.status ELSE 'sending' END AS status,
           f.id IS NULL AND d.available_at <= now() AS due
    FROM downstream_messages AS d LEFT JOIN downstream_messages_in_flight AS f ON f.id = d.id;

-- A claimed row as the claim functions return it, with what device_tokens knows of its target.
CREATE TYPE fcm_outbox_claimed_row AS (claim_id bigint, id bigint, target text, condition text, payload text,
    attempts integer, created_at float8, token_state text, token_error_code text, canonical_token text,
    registration_ids text[], token_results text);

-- Claims the rows p_ids (sorted) for p_worker for p_lease seconds, and returns them with
-- what device_tokens knows of their targets: the end of fcm_outbox_claim and fcm_outbox_sweep.
CREATE FUNCTION fcm_outbox_take(p_worker text, p_transport text, p_lease float8, p_ids bigint[])
RETURNS SETOF fcm_outbox_claimed_row
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH claims AS (
        -- At most 200 rows a claim: its row stays under the size at which PostgreSQL would
        -- compress it into TOAST (1.7 ms for a claim of 1,260 rows).
        INSERT INTO outbox_claims (worker, transport, row_ids, first_id, last_id, expires_at)
        SELECT p_worker, p_transport, array_agg(t.id ORDER BY t.id), min(t.id), max(t.id), now() + make_interval(secs => p_lease)
        FROM unnest(p_ids) WITH ORDINALITY AS t(id, n) GROUP BY (t.n - 1) / 200
        RETURNING outbox_claims.id AS claim, outbox_claims.first_id, outbox_claims.last_id
    )
    SELECT c.claim, d.id, d.target, d.condition, d.payload::text, d.attempts, extract(epoch FROM d.created_at)::float8,
           t.state, t.error_code, t.canonical_token, d.registration_ids, d.token_results::text
    -- The claims hold consecutive runs of the sorted ids: a row's claim is the one whose
    -- range holds it. (Rows found through the list, not `d.id = ANY(p_ids)`: the generic
    -- plan scanned each claim's id range and searched the list for every row in it.)
    FROM unnest(p_ids) AS k(id) JOIN downstream_messages AS d ON d.id = k.id
         JOIN claims AS c ON k.id BETWEEN c.first_id AND c.last_id
         LEFT JOIN device_tokens AS t ON t.token = d.target
    ORDER BY d.id;
END
$$;

-- Claims up to p_limit due rows of p_transport that no claim saw yet (and rows of gaps that
-- became visible), for p_worker, for p_lease seconds.
CREATE FUNCTION fcm_outbox_claim(p_worker text, p_transport text, p_limit integer, p_lease float8)
RETURNS SETOF fcm_outbox_claimed_row
LANGUAGE plpgsql
-- Plans made once per session: custom plans were made again at every call (4 ms of a 5 ms
-- claim). The sweep's set of claimed ids is hashed (work_mem bounds that).
SET plan_cache_mode = force_generic_plan SET work_mem = '64MB' AS $$
DECLARE
    cur outbox_cursors%ROWTYPE;
    running_from xid8;
    visible_gaps bigint[] := '{}';
    kept_ids bigint[] := '{}';
    kept_xmax xid8[] := '{}';
    kept_seen timestamptz[] := '{}';
    from_gaps bigint[];
    fresh bigint[];
    top bigint;
    low bigint;
    taken bigint[];
BEGIN
    -- One claim or sweep of a transport at a time; what follows sees what the one before
    -- committed. An advisory lock, not a row lock: a claim that finds nothing writes nothing,
    -- and its transaction then needs no WAL flush (idle workers claim every second).
    PERFORM pg_advisory_xact_lock(hashtext('fcm_outbox_claim'), hashtext(current_schema() || '/' || p_transport));
    SELECT * INTO cur FROM outbox_cursors AS o WHERE o.transport = p_transport;
    running_from := pg_snapshot_xmin(pg_current_snapshot());
    -- Gaps whose rows are visible now are taken below; the others are kept while a
    -- transaction that was running when they were seen may still commit them.
    SELECT coalesce(array_agg(g.gap) FILTER (WHERE g.visible), '{}'),
           coalesce(array_agg(g.gap ORDER BY g.n) FILTER (WHERE NOT g.visible AND g.xmax > running_from
                                                           AND g.seen > clock_timestamp() - interval '10 seconds'), '{}'),
           coalesce(array_agg(g.xmax ORDER BY g.n) FILTER (WHERE NOT g.visible AND g.xmax > running_from
                                                            AND g.seen > clock_timestamp() - interval '10 seconds'), '{}'),
           coalesce(array_agg(g.seen ORDER BY g.n) FILTER (WHERE NOT g.visible AND g.xmax > running_from
                                                            AND g.seen > clock_timestamp() - interval '10 seconds'), '{}')
    INTO visible_gaps, kept_ids, kept_xmax, kept_seen
    FROM (SELECT u.gap, u.xmax, u.seen, u.n, EXISTS (SELECT 1 FROM downstream_messages AS d WHERE d.id = u.gap) AS visible
          FROM unnest(cur.gap_ids, cur.gap_xmax, cur.gap_seen) WITH ORDINALITY AS u(gap, xmax, seen, n)) AS g;
    SELECT coalesce(array_agg(g.id ORDER BY g.id), '{}') INTO from_gaps FROM (
        SELECT d.id FROM downstream_messages AS d
        WHERE d.id = ANY(visible_gaps) AND d.transport = p_transport AND d.available_at <= now()
          AND NOT EXISTS (SELECT 1 FROM outbox_claims AS c
                          WHERE c.transport = p_transport AND d.id BETWEEN c.first_id AND c.last_id AND d.id = ANY(c.row_ids))
        ORDER BY d.id LIMIT p_limit) AS g;
    -- Bounded by row comparisons only: they can be index conditions of
    -- downstream_messages_unfinished alone, so whatever the statistics said when the generic
    -- plan was made, it walks that index, and from the frontier (through the primary key it
    -- walked every row of the other transport at every claim; with `transport = $1` beside
    -- them, the scan started at the transport's first entry, dead ones included).
    SELECT coalesce(array_agg(f.id ORDER BY f.id), '{}'), max(f.id) INTO fresh, top FROM (
        SELECT d.id FROM downstream_messages AS d
        WHERE (d.transport, d.id) > (p_transport, cur.frontier) AND (d.transport, d.id) <= (p_transport, 9223372036854775807)
          AND d.available_at IS NOT NULL AND d.available_at <= now()
        ORDER BY d.transport, d.id LIMIT p_limit - cardinality(from_gaps)) AS f;
    IF top IS NOT NULL THEN
        -- Ids passed whose rows are not visible: transactions in progress (or rolled back).
        -- Only among the last 2,000 ids below the newest row taken: further back lie ids
        -- of rows deleted (pruned, or the table emptied) while no claim of this transport
        -- ran, and the rare row of a transaction that held its id that long is found by
        -- the sweep once it commits.
        low := greatest(cur.frontier, top - 2000);
        IF (SELECT count(*) FROM downstream_messages AS d WHERE d.id > low AND d.id <= top) < top - low THEN
            SELECT kept_ids || coalesce(array_agg(g), '{}'),
                   kept_xmax || coalesce(array_agg(pg_snapshot_xmax(pg_current_snapshot())), '{}'),
                   kept_seen || coalesce(array_agg(clock_timestamp()), '{}')
            INTO kept_ids, kept_xmax, kept_seen
            FROM generate_series(low + 1, top) AS g
            WHERE NOT EXISTS (SELECT 1 FROM downstream_messages AS d WHERE d.id = g);
        END IF;
        cur.frontier := top;
    END IF;
    IF top IS NOT NULL OR kept_ids IS DISTINCT FROM cur.gap_ids THEN
        UPDATE outbox_cursors AS o SET frontier = cur.frontier, gap_ids = kept_ids, gap_xmax = kept_xmax, gap_seen = kept_seen
        WHERE o.transport = p_transport;
    END IF;
    taken := from_gaps || fresh;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM fcm_outbox_take(p_worker, p_transport, p_lease, taken);
END
$$;

-- Takes over the rows of expired claims, then claims up to p_limit due rows at or below the
-- frontier that no live claim names (retries, rows handed back, rows of expired claims,
-- rows of transactions that committed after their gap was forgotten), oldest due first,
-- and up to p_limit in all with fcm_outbox_claim: one round trip.
CREATE FUNCTION fcm_outbox_sweep(p_worker text, p_transport text, p_limit integer, p_lease float8)
RETURNS SETOF fcm_outbox_claimed_row
LANGUAGE plpgsql
-- Plans made once per session: custom plans were made again at every call (4 ms of a 5 ms
-- claim). The sweep's set of claimed ids is hashed (work_mem bounds that).
SET plan_cache_mode = force_generic_plan SET work_mem = '64MB' AS $$
DECLARE
    cur outbox_cursors%ROWTYPE;
    taken bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('fcm_outbox_claim'), hashtext(current_schema() || '/' || p_transport));
    SELECT * INTO cur FROM outbox_cursors AS o WHERE o.transport = p_transport;
    -- Waits for a write-back that holds one of them; its rows are then written.
    DELETE FROM outbox_claims AS c WHERE c.transport = p_transport AND c.expires_at < clock_timestamp();
    -- The unfinished rows at or below the frontier (those in flight, and those due later),
    -- through downstream_messages_unfinished (the row comparison: see fcm_outbox_claim; the
    -- claimable index would walk every due row above the frontier too, the whole backlog
    -- when sending lags behind), less the rows live claims name, as one hashed set.
    SELECT coalesce(array_agg(s.id), '{}') INTO taken FROM (
        SELECT d.id FROM downstream_messages AS d
        WHERE (d.transport, d.id) >= (p_transport, -9223372036854775808) AND (d.transport, d.id) <= (p_transport, cur.frontier)
          AND d.available_at IS NOT NULL AND d.available_at <= now()
          AND d.id NOT IN (SELECT r.id FROM outbox_claims AS c CROSS JOIN LATERAL unnest(c.row_ids) AS r(id)
                           WHERE c.transport = p_transport)
        ORDER BY d.available_at, d.id LIMIT p_limit) AS s;
    taken := ARRAY(SELECT x FROM unnest(taken) AS x ORDER BY x);
    IF cardinality(taken) > 0 THEN
        RETURN QUERY SELECT * FROM fcm_outbox_take(p_worker, p_transport, p_lease, taken);
    END IF;
    -- Then fresh rows, after this claim is in: a gap's row the sweep took is not taken twice.
    IF cardinality(taken) < p_limit THEN
        RETURN QUERY SELECT * FROM fcm_outbox_claim(p_worker, p_transport, p_limit - cardinality(taken), p_lease);
    END IF;
END
$$;
