-- Nothing dropped silently at the contract's edges.
--
-- Dead letters:
-- * 'unrouted': a message no handler's route matched (kept, and replayable once routing is
--   fixed); 'oversized': a stanza over the size limit, kept as its first bytes.
-- * handler: the handler that refused the message or failed it last; code: the reason code
--   of its PermanentFailure (or of the worker's own refusal).
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_reason_check;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_reason_check
    CHECK (reason IN ('unackable', 'unreadable', 'unknown_type', 'handler_failed', 'unrouted', 'oversized'));
ALTER TABLE dead_letters ADD COLUMN handler text, ADD COLUMN code text;

-- Rows inserted by hand: a row to send (pending or retry) without available_at is due at
-- once (it stayed pending forever); a row inserted with any other status is a record of a
-- message, never sent (one inserted as 'acked' was sent anyway). The same trigger sets the
-- transport of a multicast row, as before; its condition now spares the function call for
-- the usual row (PostgreSQL evaluates it without calling plpgsql): inserting 100,000 rows
-- took 0.85 s against 0.99 s with the call for every row.
CREATE OR REPLACE FUNCTION fcm_downstream_transport() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.registration_ids IS NOT NULL THEN
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
DROP TRIGGER downstream_messages_transport ON downstream_messages;
CREATE TRIGGER downstream_messages_transport BEFORE INSERT ON downstream_messages FOR EACH ROW
    WHEN (NEW.registration_ids IS NOT NULL OR NEW.available_at IS NULL OR NEW.status NOT IN ('pending', 'retry'))
    EXECUTE FUNCTION fcm_downstream_transport();

-- The outbox emptied (TRUNCATE, with or without RESTART IDENTITY): claims, rows due again and
-- the frontiers go with its rows, in the same transaction. The frontiers stayed at the old
-- ids, so no row inserted after a RESTART IDENTITY was ever claimed; a claim naming an id
-- now reused would have had another message's answer written into the new row.
CREATE FUNCTION fcm_outbox_emptied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM outbox_claims;
    DELETE FROM outbox_due_again;
    UPDATE outbox_cursors SET frontier = 0, gap_ids = '{}', gap_last = '{}', gap_xmax = '{}', gap_seen = '{}',
                              gaps_read_at = NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER downstream_messages_emptied AFTER TRUNCATE ON downstream_messages
    FOR EACH STATEMENT EXECUTE FUNCTION fcm_outbox_emptied();

-- The highest id the outbox's sequence has handed out (0 before the first): a sequence is
-- read as it is now, whatever the snapshot.
CREATE FUNCTION fcm_outbox_sequence_top() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM downstream_messages_id_seq AS s
$$;

-- Claims as in 0010, with the frontier bounded by the id sequence:
-- * The frontier never passes the highest id the sequence has handed out. A row inserted
--   with an id above it (given by hand) moved the frontier there, and every row after it
--   stayed below the frontier, unclaimed, for good. Such rows now come last in the claim's
--   scan from the frontier, and are taken when due and named by no live claim; the
--   frontier stops at the top.
-- * A frontier found above the sequence's top (the sequence restarted or set back after the
--   rows were deleted; a frontier moved by such a row before this migration) is reset to
--   that top in the same transaction, with every id at or below it kept as one range of
--   ids to read (a gap, as below), so that no committed row is skipped; the transport's
--   claims go (a claim naming an id now reused would have another message's answer written
--   into the new row; a row still in flight may be sent again: at least once).
CREATE OR REPLACE FUNCTION fcm_outbox_claim(p_worker text, p_transport text, p_limit integer, p_lease float8)
RETURNS SETOF fcm_outbox_claimed_row
LANGUAGE plpgsql
-- No JIT: the estimated costs of its statements (subplans times guessed rows) passed
-- jit_above_cost, and compiling them took 20-25 ms a call.
SET plan_cache_mode = force_generic_plan SET work_mem = '64MB' SET jit = off AS $$
DECLARE
    cur outbox_cursors%ROWTYPE;
    running_from xid8;
    sequence_top bigint;
    present bigint[];
    candidates bigint[];
    candidate_due timestamptz[];
    taken bigint[] := '{}';
    later_ids bigint[] := '{}';
    later_due timestamptz[] := '{}';
    kept_first bigint[] := '{}';
    kept_last bigint[] := '{}';
    kept_bound xid8[] := '{}';
    kept_seen timestamptz[] := '{}';
    checked_at timestamptz;
    gaps_read boolean := false;
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

    -- The sequence went back below the frontier. Every id a transaction may still commit at
    -- or below the top was handed out before this read, after its transaction's xid; this
    -- transaction's xid, handed out by the writes below, comes after all of theirs and
    -- bounds the range, as a claim's own xid bounds the gaps it sees. Nothing more is done
    -- in this call: what it would read next must not come after its own xid.
    sequence_top := fcm_outbox_sequence_top();
    IF cur.frontier > sequence_top THEN
        DELETE FROM outbox_claims AS c WHERE c.transport = p_transport;
        UPDATE outbox_cursors AS o SET frontier = sequence_top,
            gap_ids = CASE WHEN sequence_top >= 1 THEN ARRAY[1::bigint] ELSE '{}' END,
            gap_last = CASE WHEN sequence_top >= 1 THEN ARRAY[sequence_top] ELSE '{}' END,
            gap_xmax = CASE WHEN sequence_top >= 1 THEN ARRAY[pg_current_xact_id()] ELSE '{}' END,
            gap_seen = CASE WHEN sequence_top >= 1 THEN ARRAY[clock_timestamp()] ELSE '{}' END,
            gaps_read_at = NULL
        WHERE o.transport = p_transport;
        RAISE LOG 'fcm_outbox_claim: the % frontier (%) was above the id sequence (%): reset to it',
            p_transport, cur.frontier, sequence_top;
        -- This transaction has written (and has its xid): the next claim reads the range.
        RETURN;
    END IF;

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

    -- The rest is one statement, so one snapshot; it writes, so it comes after every
    -- observation above. It reads the rows no claim saw yet, from the frontier in id order up
    -- to the sequence's top, due or not (bounded by row comparisons only, so that the generic
    -- plan walks downstream_messages_by_transport from the frontier), and the ids passed whose
    -- rows are not visible: transactions in progress (or rolled back, or ids never used), as
    -- ranges. A row that commits meanwhile is either scanned or in a range. The top is read
    -- during the statement (s, once), after its snapshot: every row the snapshot shows with an
    -- id from the sequence is at or below it, and the rows above it (o) were given their ids
    -- by hand. Whether a row is due is read from the clock during the statement (t, once),
    -- after its snapshot: a row inserted after this transaction began (its available_at after
    -- now()) that the snapshot shows is due, where now() would leave it to a sweep the worker
    -- has no reason to run soon. Each row is read once, whole, and returned as read; the rows
    -- the gaps gave are read by id.
    RETURN QUERY
    WITH t AS MATERIALIZED (SELECT clock_timestamp() AS at),
    s AS MATERIALIZED (SELECT fcm_outbox_sequence_top() AS top),
    -- One scan from the frontier: the rows up to the sequence's top, and after them (rare)
    -- the rows above it that are due and named by no live claim.
    f AS MATERIALIZED (
        SELECT d.id, d.available_at, d.target, d.condition, d.payload, d.attempts, d.created_at, d.registration_ids,
               d.token_results, d.id <= (SELECT s.top FROM s) AS fresh
        FROM downstream_messages AS d
        WHERE (d.transport, d.id) > (p_transport, cur.frontier) AND (d.transport, d.id) <= (p_transport, 9223372036854775807)
          AND d.available_at IS NOT NULL
          AND (d.id <= (SELECT s.top FROM s)
               OR (d.available_at <= (SELECT t.at FROM t)
                   AND NOT EXISTS (SELECT 1 FROM outbox_claims AS c
                                   WHERE c.transport = p_transport AND d.id BETWEEN c.first_id AND c.last_id
                                     AND d.id = ANY(c.row_ids))))
        ORDER BY d.transport, d.id LIMIT p_limit - cardinality(taken)
    ),
    p AS (
        SELECT cur.frontier AS id
        -- Read only when f left out an id between the frontier and its last row: when f holds
        -- every id there (the usual case), none is missing.
        UNION ALL SELECT d.id FROM downstream_messages AS d
            WHERE d.id > cur.frontier AND d.id <= (SELECT max(f.id) FROM f WHERE f.fresh)
              AND (SELECT count(*) FROM f WHERE f.fresh) <> (SELECT max(f.id) FROM f WHERE f.fresh) - cur.frontier
    ), e AS (SELECT p.id, lag(p.id) OVER (ORDER BY p.id) AS prev FROM p),
    new_ranges AS MATERIALIZED (
        SELECT coalesce(array_agg(e.prev + 1 ORDER BY e.id), '{}') AS range_first,
               coalesce(array_agg(e.id - 1 ORDER BY e.id), '{}') AS range_last
        FROM e WHERE e.id - e.prev > 1
    ),
    -- The ranges kept. New ones are bounded by this transaction's xid, handed out only now
    -- (after the snapshot), and only when there are new ones: a claim that finds nothing
    -- writes nothing, and its transaction needs no WAL flush.
    ranges AS MATERIALIZED (
        SELECT kept_first || n.range_first AS range_first, kept_last || n.range_last AS range_last,
               CASE WHEN cardinality(n.range_first) > 0
                    THEN kept_bound || array_fill(pg_current_xact_id(), ARRAY[cardinality(n.range_first)])
                    ELSE kept_bound END AS range_bound,
               CASE WHEN cardinality(n.range_first) > 0
                    THEN kept_seen || array_fill(clock_timestamp(), ARRAY[cardinality(n.range_first)])
                    ELSE kept_seen END AS range_seen
        FROM new_ranges AS n
    ),
    changes AS MATERIALIZED (
        SELECT r.*, (SELECT max(f.id) FROM f WHERE f.fresh) AS top,
               r.range_first IS DISTINCT FROM cur.gap_ids OR r.range_last IS DISTINCT FROM cur.gap_last
               OR r.range_bound IS DISTINCT FROM cur.gap_xmax AS gaps_changed
        FROM ranges AS r
    ),
    -- Ranges unchanged keep their stored arrays (a column set to itself is not written
    -- again, however large it is).
    cursor_written AS (
        UPDATE outbox_cursors AS o SET frontier = greatest(cur.frontier, coalesce(c.top, cur.frontier)),
            gap_ids = CASE WHEN c.gaps_changed THEN c.range_first ELSE o.gap_ids END,
            gap_last = CASE WHEN c.gaps_changed THEN c.range_last ELSE o.gap_last END,
            gap_xmax = CASE WHEN c.gaps_changed THEN c.range_bound ELSE o.gap_xmax END,
            gap_seen = CASE WHEN c.gaps_changed THEN c.range_seen ELSE o.gap_seen END,
            gaps_read_at = CASE WHEN gaps_read THEN clock_timestamp() ELSE o.gaps_read_at END
        FROM changes AS c
        WHERE o.transport = p_transport
          AND (c.top IS NOT NULL OR c.gaps_changed OR (gaps_read AND cardinality(cur.gap_ids) > many_gaps))
        RETURNING 1
    ),
    -- Rows not due yet (of the gaps and fresh ones) wait in outbox_due_again.
    later_written AS (
        INSERT INTO outbox_due_again (transport, id, due_at)
        SELECT p_transport, u.id, u.at
        FROM (SELECT l.id, l.at FROM unnest(later_ids, later_due) AS l(id, at)
              UNION ALL SELECT f.id, f.available_at FROM f, t WHERE f.fresh AND f.available_at > t.at) AS u
        ON CONFLICT (transport, id) DO UPDATE SET due_at = excluded.due_at
        RETURNING 1
    ),
    -- The rows taken: those of the gaps (before the frontier, so first in id order), then
    -- the fresh ones that are due and those above the sequence's top; numbered in that order
    -- for their claims.
    due AS MATERIALIZED (
        SELECT k.id, k.n FROM unnest(taken) WITH ORDINALITY AS k(id, n)
        UNION ALL
        SELECT f.id, cardinality(taken) + row_number() OVER (ORDER BY f.id) FROM f, t WHERE f.available_at <= t.at
    ),
    -- At most 200 rows a claim: its row stays under the size at which PostgreSQL would
    -- compress it into TOAST (1.7 ms for a claim of 1,260 rows). Each claim's rows are a
    -- range of ids that no other claim of this call overlaps.
    claims AS (
        INSERT INTO outbox_claims (worker, transport, row_ids, first_id, last_id, expires_at)
        SELECT p_worker, p_transport, array_agg(u.id ORDER BY u.id), min(u.id), max(u.id), now() + make_interval(secs => p_lease)
        FROM due AS u GROUP BY (u.n - 1) / 200
        RETURNING outbox_claims.id, outbox_claims.first_id, outbox_claims.last_id
    )
    SELECT c.id, r.id, r.target, r.condition, r.payload::text, r.attempts, extract(epoch FROM r.created_at)::float8,
           tk.state, tk.error_code, tk.canonical_token, r.registration_ids, r.token_results::text
    FROM (SELECT d.id, d.target, d.condition, d.payload, d.attempts, d.created_at, d.registration_ids, d.token_results
          FROM unnest(taken) AS k(id)
               CROSS JOIN LATERAL (SELECT x.* FROM downstream_messages AS x WHERE x.id = k.id OFFSET 0) AS d
          UNION ALL
          SELECT f.id, f.target, f.condition, f.payload, f.attempts, f.created_at, f.registration_ids, f.token_results
          FROM f, t WHERE f.available_at <= t.at
) AS r
         JOIN claims AS c ON r.id BETWEEN c.first_id AND c.last_id
         LEFT JOIN device_tokens AS tk ON tk.token = r.target;
END
$$;
