-- A row's final answer as a HOT update (issue 16; docs/outbox-hot-updates.md). An update is
-- HOT (heap-only: on the row's own page, no new index entry) when no indexed column changes,
-- and PostgreSQL counts the columns of an index's predicate as indexed. The final answer
-- clears available_at, which downstream_messages_unfinished's predicate names, so each
-- answer wrote a new primary-key entry, mostly on another page. Measured in `bench
-- downstream`'s statements alone: the same update HOT costs 38-49 % less.
--
-- What the unfinished index did, now done without it:
-- * The claims' fresh rows (above the frontier): a plain index on (transport, id); whether a
--   row is due is read from the row the scan visits anyway.
-- * Rows due again at or below the frontier (retries, hand-backs, requeued rows, rows whose
--   available_at anyone sets again): outbox_due_again, filled by a trigger on available_at.
--   The final answer clears available_at and the 'sent' update keeps it: the trigger's
--   condition is false for both, and PostgreSQL evaluates it without calling the function.
-- * Rows the frontier passed before they were due: the claim puts them in outbox_due_again.
-- * Rows of expired claims: the sweep takes them, and puts those it does not take in
--   outbox_due_again as it deletes the claims.
-- * Rows whose ids the frontier passed while their transactions were running (late
--   commits): claims keep the missing ids as ranges, each with a bound (the claiming
--   transaction's own xid), until every transaction that could hold one of them has ended.
--   A row's id now comes after its transaction's xid (the id's default), so a transaction
--   holding a missing id has an xid below the bound; once a snapshot's xmin passes the bound,
--   the range's rows are all visible or never will be. No time limit, no 2,000-id window.
--   Unsafe, and so unsupported: a row inserted with an id taken earlier by nextval() in a
--   transaction that had not written yet, or a sequence with a CACHE above 1.
--
-- Pages are filled to 40 % at insert, so that a row's final version (larger than its first)
-- finds room on its page; the first versions are pruned once no snapshot needs them. The
-- table takes about 2.5 times the pages until `fcm-worker prune` deletes finished rows.

CREATE TABLE outbox_due_again (
    transport text NOT NULL,
    id        bigint NOT NULL,
    due_at    timestamptz NOT NULL,
    PRIMARY KEY (transport, id)
);
CREATE INDEX outbox_due_again_by_due ON outbox_due_again (transport, due_at);

CREATE FUNCTION fcm_outbox_note_due_again() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_due_again (transport, id, due_at) VALUES (NEW.transport, NEW.id, NEW.available_at)
    ON CONFLICT (transport, id) DO UPDATE SET due_at = excluded.due_at;
    RETURN NULL;
END
$$;
CREATE TRIGGER downstream_messages_due_again AFTER UPDATE OF available_at ON downstream_messages
    FOR EACH ROW WHEN (NEW.available_at IS NOT NULL AND OLD.available_at IS DISTINCT FROM NEW.available_at)
    EXECUTE FUNCTION fcm_outbox_note_due_again();

-- Every unfinished row at or below its transport's frontier, found while the unfinished index
-- is still there (rows of live claims too: the sweep skips a row a live claim names).
INSERT INTO outbox_due_again (transport, id, due_at)
SELECT d.transport, d.id, d.available_at
FROM outbox_cursors AS c JOIN downstream_messages AS d ON d.transport = c.transport AND d.id <= c.frontier
WHERE d.available_at IS NOT NULL;

CREATE INDEX downstream_messages_by_transport ON downstream_messages (transport, id);
DROP INDEX downstream_messages_unfinished;
ALTER TABLE downstream_messages SET (fillfactor = 40);

-- The transaction's xid first, then the id (see above).
ALTER TABLE downstream_messages ALTER COLUMN id SET DEFAULT
    CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval('downstream_messages_id_seq'::regclass) END;

-- Gaps as ranges: gap_ids holds each range's first id, gap_last its last, gap_xmax its bound.
-- The gaps kept so far become one-id ranges, bounded by this transaction's xid, which comes
-- after every xid handed out before it.
ALTER TABLE outbox_cursors ADD COLUMN gap_last bigint[] NOT NULL DEFAULT '{}';
-- When a claim last read the rows of the gaps (see many_gaps in fcm_outbox_claim).
ALTER TABLE outbox_cursors ADD COLUMN gaps_read_at timestamptz;
UPDATE outbox_cursors SET gap_last = gap_ids,
    gap_xmax = array_fill(pg_current_xact_id(), ARRAY[cardinality(gap_ids)]);

-- Every row a claim or sweep has not finished with: above its transport's frontier, due
-- again, or named by a claim (and, for less than a claim's time, the visible rows of a gap).
-- For the metrics, which must not read the finished rows.
CREATE VIEW downstream_messages_open AS
    SELECT d.id FROM outbox_cursors AS c JOIN downstream_messages AS d ON d.transport = c.transport AND d.id > c.frontier
    UNION SELECT e.id FROM outbox_due_again AS e
    UNION SELECT r.id FROM outbox_claims AS c CROSS JOIN LATERAL unnest(c.row_ids) AS r(id);

-- downstream_messages_shown, for the open rows only, each read by its id.
CREATE VIEW downstream_messages_open_shown AS
    SELECT d.id, d.transport, d.available_at,
           CASE WHEN f.id IS NULL OR d.status = 'sent' OR d.available_at IS NULL THEN d.status ELSE 'sending' END AS status,
           f.id IS NULL AND d.available_at <= now() AS due
    FROM downstream_messages_open AS o
         -- OFFSET 0: not pulled up into a join that could read the whole outbox.
         CROSS JOIN LATERAL (SELECT x.* FROM downstream_messages AS x WHERE x.id = o.id OFFSET 0) AS d
         LEFT JOIN downstream_messages_in_flight AS f ON f.id = d.id;

-- Claims up to p_limit due rows of p_transport: rows that became visible in the gaps, then
-- rows no claim saw yet, in id order; for p_worker, for p_lease seconds.
CREATE OR REPLACE FUNCTION fcm_outbox_claim(p_worker text, p_transport text, p_limit integer, p_lease float8)
RETURNS SETOF fcm_outbox_claimed_row
LANGUAGE plpgsql
-- No JIT: the estimated costs of its statements (subplans times guessed rows) passed
-- jit_above_cost, and compiling them took 20-25 ms a call.
SET plan_cache_mode = force_generic_plan SET work_mem = '64MB' SET jit = off AS $$
DECLARE
    cur outbox_cursors%ROWTYPE;
    running_from xid8;
    bound xid8;
    present bigint[];
    candidates bigint[];
    candidate_due timestamptz[];
    fresh_due bigint[];
    fresh_later bigint[];
    fresh_later_at timestamptz[];
    top bigint;
    taken bigint[] := '{}';
    later_ids bigint[] := '{}';
    later_due timestamptz[] := '{}';
    kept_first bigint[] := '{}';
    kept_last bigint[] := '{}';
    kept_bound xid8[] := '{}';
    kept_seen timestamptz[] := '{}';
    new_first bigint[];
    new_last bigint[];
    checked_at timestamptz;
    gaps_read boolean := false;
    gaps_changed boolean;
    -- Gaps pile up only while a transaction stays open somewhere in the cluster (ids rolled
    -- back meanwhile are kept until it ends), and each read of them costs a lookup a range.
    -- Beyond this many, they are read at most every gaps_read_interval: a row committed
    -- late into one of them then waits that much longer, and claims stay cheap.
    many_gaps constant integer := 256;
    gaps_read_interval constant interval := '250 milliseconds';
BEGIN
    -- One claim or sweep of a transport at a time; what follows sees what the one before
    -- committed. An advisory lock, not a row lock: a claim that finds nothing writes nothing,
    -- and its transaction then needs no WAL flush (idle workers claim every second).
    PERFORM pg_advisory_xact_lock(hashtext('fcm_outbox_claim'), hashtext(current_schema() || '/' || p_transport));
    -- Nothing is written before the observations below: the bound of the gaps seen here is
    -- this transaction's xid, and it must be handed out after them (fcm_outbox_sweep calls
    -- this before it writes).
    SELECT * INTO cur FROM outbox_cursors AS o WHERE o.transport = p_transport;
    running_from := pg_snapshot_xmin(pg_current_snapshot());

    -- Gaps are rare: without any, none of these three statements runs.
    IF cardinality(cur.gap_ids) > 0
       AND (cardinality(cur.gap_ids) <= many_gaps OR cur.gaps_read_at IS NULL
            OR cur.gaps_read_at <= clock_timestamp() - gaps_read_interval) THEN
        gaps_read := true;
        -- The rows now visible in the gaps: each is handled once (taken, or due again) and
        -- leaves its range; so do the rows of other transports, rows never to be sent
        -- (available_at NULL), and rows a claim names (a sweep took one whose available_at was
        -- set again meanwhile: it is that claim's).
        -- Each range read through the primary key (LATERAL, OFFSET 0: the generic plan hashed
        -- the whole outbox for a join on the ranges, 400 ms a claim at 50,000 rows).
        SELECT coalesce(array_agg(g.id ORDER BY g.id), '{}'),
               coalesce(array_agg(g.id ORDER BY g.id) FILTER (WHERE g.candidate), '{}'),
               coalesce(array_agg(g.available_at ORDER BY g.id) FILTER (WHERE g.candidate), '{}')
        INTO present, candidates, candidate_due
        FROM (SELECT d.id, d.available_at,
                     d.transport = p_transport AND d.available_at IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM outbox_claims AS c
                                     WHERE c.transport = p_transport AND d.id BETWEEN c.first_id AND c.last_id AND d.id = ANY(c.row_ids))
                     AS candidate
              FROM unnest(cur.gap_ids, cur.gap_last) AS r(first, last)
                   CROSS JOIN LATERAL (SELECT x.id, x.transport, x.available_at FROM downstream_messages AS x
                                       WHERE x.id >= r.first AND x.id <= r.last OFFSET 0) AS d) AS g;
        -- Due by the clock after that read, not by now() (this transaction's start): each
        -- statement of a function reads a snapshot of its own, and a row it saw may have been
        -- inserted after this transaction began, with an available_at after now().
        checked_at := clock_timestamp();
        -- Due ones are taken (up to p_limit); the others wait in outbox_due_again.
        SELECT coalesce(array_agg(c.id ORDER BY c.n) FILTER (WHERE c.due AND c.rank <= p_limit), '{}'),
               coalesce(array_agg(c.id ORDER BY c.n) FILTER (WHERE NOT (c.due AND c.rank <= p_limit)), '{}'),
               coalesce(array_agg(c.at ORDER BY c.n) FILTER (WHERE NOT (c.due AND c.rank <= p_limit)), '{}')
        INTO taken, later_ids, later_due
        FROM (SELECT u.id, u.at, u.n, u.at <= checked_at AS due,
                     count(*) FILTER (WHERE u.at <= checked_at) OVER (ORDER BY u.n) AS rank
              FROM unnest(candidates, candidate_due) WITH ORDINALITY AS u(id, at, n)) AS c;

        -- The ranges kept: what is still missing of each, unless every transaction that could
        -- hold one of its ids has ended (the first snapshot xmin past its bound).
        SELECT coalesce(array_agg(s.first ORDER BY s.first), '{}'), coalesce(array_agg(s.last ORDER BY s.first), '{}'),
               coalesce(array_agg(s.bound ORDER BY s.first), '{}'), coalesce(array_agg(s.seen ORDER BY s.first), '{}')
        INTO kept_first, kept_last, kept_bound, kept_seen
        FROM (SELECT e.prev + 1 AS first, e.id - 1 AS last, e.bound, e.seen
              FROM (SELECT r.bound, r.seen, p.id, lag(p.id) OVER (PARTITION BY r.first ORDER BY p.id) AS prev
                    FROM unnest(cur.gap_ids, cur.gap_last, cur.gap_xmax, cur.gap_seen) AS r(first, last, bound, seen)
                         CROSS JOIN LATERAL (SELECT r.first - 1 AS id
                                             UNION ALL SELECT x FROM unnest(present) AS x WHERE x >= r.first AND x <= r.last
                                             UNION ALL SELECT r.last + 1) AS p
                    WHERE r.bound >= running_from) AS e
              WHERE e.id - e.prev > 1) AS s;
    ELSE
        -- Not read now: every range is kept as it is.
        kept_first := cur.gap_ids;
        kept_last := cur.gap_last;
        kept_bound := cur.gap_xmax;
        kept_seen := cur.gap_seen;
    END IF;

    -- Rows no claim saw yet, from the frontier in id order, due or not (bounded by row
    -- comparisons only, so that the generic plan walks downstream_messages_by_transport from
    -- the frontier), and the ids passed whose rows are not visible: transactions in progress
    -- (or rolled back, or ids never used), as ranges. One statement, so one snapshot: a row
    -- that commits meanwhile is either scanned or in a range. Whether a row is due is read
    -- from the clock during the statement (t, once), after its snapshot: a row inserted
    -- after this transaction began (its available_at after now()) that the snapshot shows
    -- is due, where now() would leave it to a sweep the worker has no reason to run soon.
    IF cardinality(taken) < p_limit THEN
        WITH t AS MATERIALIZED (SELECT clock_timestamp() AS at),
        f AS MATERIALIZED (
            SELECT d.id, d.available_at FROM downstream_messages AS d
            WHERE (d.transport, d.id) > (p_transport, cur.frontier) AND (d.transport, d.id) <= (p_transport, 9223372036854775807)
              AND d.available_at IS NOT NULL
            ORDER BY d.transport, d.id LIMIT p_limit - cardinality(taken)
        ), p AS (
            SELECT cur.frontier AS id
            UNION ALL SELECT d.id FROM downstream_messages AS d WHERE d.id > cur.frontier AND d.id <= (SELECT max(f.id) FROM f)
        ), e AS (SELECT p.id, lag(p.id) OVER (ORDER BY p.id) AS prev FROM p)
        SELECT (SELECT coalesce(array_agg(f.id ORDER BY f.id) FILTER (WHERE f.available_at <= t.at), '{}') FROM f, t),
               (SELECT coalesce(array_agg(f.id ORDER BY f.id) FILTER (WHERE f.available_at > t.at), '{}') FROM f, t),
               (SELECT coalesce(array_agg(f.available_at ORDER BY f.id) FILTER (WHERE f.available_at > t.at), '{}') FROM f, t),
               (SELECT max(f.id) FROM f),
               coalesce(array_agg(e.prev + 1 ORDER BY e.id) FILTER (WHERE e.id - e.prev > 1), '{}'),
               coalesce(array_agg(e.id - 1 ORDER BY e.id) FILTER (WHERE e.id - e.prev > 1), '{}')
        INTO fresh_due, fresh_later, fresh_later_at, top, new_first, new_last FROM e;
        -- Above the frontier, so after every id a gap gave: taken stays in id order.
        taken := taken || fresh_due;
        later_ids := later_ids || fresh_later;
        later_due := later_due || fresh_later_at;
    END IF;

    -- Observed: from here on this transaction writes, and its xid bounds the new ranges.
    IF cardinality(new_first) > 0 THEN
        bound := pg_current_xact_id();
        kept_first := kept_first || new_first;
        kept_last := kept_last || new_last;
        kept_bound := kept_bound || array_fill(bound, ARRAY[cardinality(new_first)]);
        kept_seen := kept_seen || array_fill(clock_timestamp(), ARRAY[cardinality(new_first)]);
    END IF;
    gaps_changed := kept_first IS DISTINCT FROM cur.gap_ids OR kept_last IS DISTINCT FROM cur.gap_last
                    OR kept_bound IS DISTINCT FROM cur.gap_xmax;
    IF top IS NOT NULL OR gaps_changed OR (gaps_read AND cardinality(cur.gap_ids) > many_gaps) THEN
        -- Ranges unchanged keep their stored arrays (a column set to itself is not written
        -- again, however large it is).
        UPDATE outbox_cursors AS o SET frontier = greatest(cur.frontier, coalesce(top, cur.frontier)),
            gap_ids = CASE WHEN gaps_changed THEN kept_first ELSE o.gap_ids END,
            gap_last = CASE WHEN gaps_changed THEN kept_last ELSE o.gap_last END,
            gap_xmax = CASE WHEN gaps_changed THEN kept_bound ELSE o.gap_xmax END,
            gap_seen = CASE WHEN gaps_changed THEN kept_seen ELSE o.gap_seen END,
            gaps_read_at = CASE WHEN gaps_read THEN clock_timestamp() ELSE o.gaps_read_at END
        WHERE o.transport = p_transport;
    END IF;
    IF cardinality(later_ids) > 0 THEN
        INSERT INTO outbox_due_again (transport, id, due_at)
        SELECT p_transport, u.id, u.at FROM unnest(later_ids, later_due) AS u(id, at)
        ON CONFLICT (transport, id) DO UPDATE SET due_at = excluded.due_at;
    END IF;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM fcm_outbox_take(p_worker, p_transport, p_lease, taken);
END
$$;

-- Claims up to p_limit due rows of p_transport at or below the frontier that no live claim
-- names (rows due again, rows of expired claims), oldest due first, and up to p_limit in
-- all with fcm_outbox_claim: one round trip.
CREATE OR REPLACE FUNCTION fcm_outbox_sweep(p_worker text, p_transport text, p_limit integer, p_lease float8)
RETURNS SETOF fcm_outbox_claimed_row
LANGUAGE plpgsql
-- No JIT: the estimated costs of its statements (subplans times guessed rows) passed
-- jit_above_cost, and compiling them took 20-25 ms a call.
SET plan_cache_mode = force_generic_plan SET work_mem = '64MB' SET jit = off AS $$
DECLARE
    cur outbox_cursors%ROWTYPE;
    chosen bigint[];
    taken bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('fcm_outbox_claim'), hashtext(current_schema() || '/' || p_transport));
    SELECT * INTO cur FROM outbox_cursors AS o WHERE o.transport = p_transport;
    -- Read first, write after fcm_outbox_claim (whose gap bounds need it): the rows due again
    -- and the rows of expired claims, due, unfinished, not named by a live claim.
    -- Every row read by its id (LATERAL, OFFSET 0), so that no generic plan joins the
    -- whole outbox.
    SELECT coalesce(array_agg(s.id ORDER BY s.available_at, s.id), '{}') INTO chosen FROM (
        SELECT d.id, d.available_at
        FROM (SELECT e.id FROM outbox_due_again AS e
              WHERE e.transport = p_transport AND e.due_at <= now() AND e.id <= cur.frontier
              UNION
              SELECT r.id FROM outbox_claims AS c CROSS JOIN LATERAL unnest(c.row_ids) AS r(id)
              WHERE c.transport = p_transport AND c.expires_at < clock_timestamp()) AS k
             CROSS JOIN LATERAL (SELECT x.id, x.available_at FROM downstream_messages AS x WHERE x.id = k.id OFFSET 0) AS d
        WHERE d.available_at IS NOT NULL AND d.available_at <= now()
          AND NOT EXISTS (SELECT 1 FROM outbox_claims AS c
                          WHERE c.transport = p_transport AND c.expires_at >= clock_timestamp()
                            AND d.id BETWEEN c.first_id AND c.last_id AND d.id = ANY(c.row_ids))
        ORDER BY d.available_at, d.id LIMIT p_limit) AS s;
    IF cardinality(chosen) < p_limit THEN
        RETURN QUERY SELECT * FROM fcm_outbox_claim(p_worker, p_transport, p_limit - cardinality(chosen), p_lease);
    END IF;
    -- Expired claims go (waiting for a write-back that holds one of them; its rows are then
    -- written); their rows that are not finished are due again, so that none is lost.
    WITH gone AS (
        DELETE FROM outbox_claims AS c WHERE c.transport = p_transport AND c.expires_at < clock_timestamp() RETURNING c.row_ids
    )
    INSERT INTO outbox_due_again (transport, id, due_at)
    SELECT p_transport, d.id, d.available_at
    FROM gone AS g CROSS JOIN LATERAL unnest(g.row_ids) AS r(id)
         CROSS JOIN LATERAL (SELECT x.id, x.available_at FROM downstream_messages AS x WHERE x.id = r.id OFFSET 0) AS d
    WHERE d.available_at IS NOT NULL
    ON CONFLICT (transport, id) DO UPDATE SET due_at = excluded.due_at;
    -- The rows chosen, as they are now (a write-back may have finished some meanwhile).
    SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}') INTO taken FROM downstream_messages AS d
    WHERE d.id = ANY(chosen) AND d.available_at IS NOT NULL AND d.available_at <= now()
      AND NOT EXISTS (SELECT 1 FROM outbox_claims AS c
                      WHERE c.transport = p_transport AND d.id BETWEEN c.first_id AND c.last_id AND d.id = ANY(c.row_ids));
    -- Entries done with: the rows taken now, and rows finished or gone.
    DELETE FROM outbox_due_again AS e
    WHERE e.transport = p_transport AND e.due_at <= now()
      AND (e.id = ANY(taken)
           OR NOT EXISTS (SELECT 1 FROM downstream_messages AS d WHERE d.id = e.id AND d.available_at IS NOT NULL OFFSET 0));
    IF cardinality(taken) > 0 THEN
        RETURN QUERY SELECT * FROM fcm_outbox_take(p_worker, p_transport, p_lease, taken);
    END IF;
END
$$;
