-- The lane routine on PostgreSQL, version 3 (ductwork/limits/claims.py::release_and_claim): version 2
-- (ductwork/db/migrations/routines/release_and_claim_2.postgresql.sql, key families: docs/semantics.md
-- §5.1) whose bound, the oldest of every other lane a poll would try now [INV-LIM-6], is read by
-- walking the pending executions in poll order from the oldest (ix_execution_pending_order)
-- until the first lane that may admit, instead of probing every key's row: its cost grows with
-- the pending executions older than the key's own, never with the number of keys (issue 34).
-- A refinement of ductwork/limits/plan.py::plan, checked against it state by state on this
-- database (tests/properties/test_refinement.py). Installed by migration 0014; a change is a
-- new version of the routine (a new name) in a new migration.

-- The key decision (buckets.decide) on one key's buckets, config order: the stored level and
-- refill time of each kept rate entry (NULL: no bucket yet, created empty at now).
CREATE FUNCTION ductwork_decide_3(
    p_configured boolean, p_concurrency integer, p_limit bigint[], p_per bigint[], p_burst bigint[],
    p_level bigint[], p_time bigint[], p_in_flight integer, p_now_us bigint,
    OUT admitted boolean, OUT refused text, OUT level bigint[], OUT refilled_at bigint[],
    OUT stamp boolean, OUT blocked_us bigint, OUT unconfigured boolean)
LANGUAGE plpgsql IMMUTABLE AS $decide$
DECLARE
    n integer := coalesce(array_length(p_limit, 1), 0);
    cap bigint;
    lv bigint;
    t bigint;
    dt bigint;
    missing bigint;
BEGIN
    level := '{}';
    refilled_at := '{}';
    stamp := false;
    blocked_us := NULL;
    unconfigured := false;
    refused := NULL;
    IF p_in_flight < 0 THEN
        RAISE EXCEPTION '[INV-LIM-3] negative in-flight count %', p_in_flight;
    END IF;
    IF NOT p_configured THEN  -- 1. no entry: admitted unlimited, the stamp cleared
        admitted := true;
        stamp := true;
        unconfigured := true;
        RETURN;
    END IF;
    IF p_concurrency IS NOT NULL AND p_in_flight >= p_concurrency THEN  -- [INV-LIM-1] 2. nothing refilled, stamped
        admitted := false;
        refused := 'concurrency';
        RETURN;
    END IF;
    FOR i IN 1 .. n LOOP  -- 3. refill every kept bucket [INV-LIM-4]
        cap := p_burst[i] * p_per[i] * 1000000;
        lv := coalesce(p_level[i], 0);
        t := coalesce(p_time[i], p_now_us);
        IF lv < 0 THEN
            RAISE EXCEPTION '[INV-LIM-4] bucket of period % s has a negative level %', p_per[i], lv;
        END IF;
        lv := least(lv, cap);  -- [INV-LIM-4] clamp to the current burst
        dt := p_now_us - t;
        IF dt > 0 THEN  -- time that went backwards adds nothing
            IF dt >= (cap - lv + p_limit[i] - 1) / p_limit[i] THEN
                lv := cap;
            ELSE
                lv := lv + dt * p_limit[i];
            END IF;
        END IF;
        level[i] := lv;
        refilled_at[i] := greatest(t, p_now_us);  -- never moves backwards [INV-LIM-2]
    END LOOP;
    FOR i IN 1 .. n LOOP  -- 4. the latest next-token time of the short buckets [INV-LIM-5]
        missing := p_per[i] * 1000000 - level[i];
        IF missing > 0 THEN
            blocked_us := greatest(blocked_us, refilled_at[i] + (missing + p_limit[i] - 1) / p_limit[i]);
        END IF;
    END LOOP;
    IF blocked_us IS NOT NULL THEN  -- refused for rate, stamped with the exact next-token time
        admitted := false;
        refused := 'rate';
        stamp := true;
        RETURN;
    END IF;
    FOR i IN 1 .. n LOOP  -- 5. admitted: one token from every bucket [INV-LIM-2]
        level[i] := level[i] - p_per[i] * 1000000;
    END LOOP;
    FOR i IN 1 .. n LOOP  -- the stamp over the buckets now short, or cleared [INV-LIM-5]
        missing := p_per[i] * 1000000 - level[i];
        IF missing > 0 THEN
            blocked_us := greatest(blocked_us, refilled_at[i] + (missing + p_limit[i] - 1) / p_limit[i]);
        END IF;
    END LOOP;
    admitted := true;
    stamp := true;
END
$decide$;
-- ---- (one statement each: the migration sends them one by one)

-- The routine. p_key: the lane's key (NULL: the unkeyed lane); p_owner: the owner (NULL: the
-- endings are orphans'); p_ends: the executions to end, in order (each takes the key's next
-- sequence number), with one outcome and error; p_take: how many to claim (0: only the
-- endings); p_poll: a poll's claim (no lane-first rule, refusals written) or a hand-off;
-- p_now: a fixed time (a test's clock), else the database clock plus p_offset_us, read after
-- the key's lock [INV-CLK-1]; p_entry: this process's entry for the key ({"c": concurrency or
-- null, "r": [[limit, per_s, burst], ...] kept rates in config order}; NULL: unconfigured),
-- p_digest its fingerprint (limit_entries.entry_digest), p_keys every configured key and family
-- ([{"k": key, "c": concurrency, "d": digest}]; a family's: {"k": family, "c": per-partition
-- concurrency, "d": per-partition digest, "p": true, "f": the family's ceiling or null}) and
-- p_unconfigured the fingerprint of no entry: what the lane scan of every other lane needs
-- (lanes.scan_lanes); p_family: the family p_key is a partition of, when that family has a
-- ceiling, p_family_ceiling (else both NULL): its row is locked first, before p_key's, and its
-- in-flight count over all its partitions decides before the key does [INV-LIM-8].
-- Returns one row per execution claimed, in order, else one row with no execution; every
-- row carries the status (NULL, 'taken': an ending was not open and the owner's, nothing else
-- done, roll back; a poll's refusal: 'gone', 'family_concurrency', 'concurrency', 'rate'), the routine's time,
-- the stamp written and whether the key is unconfigured.
CREATE FUNCTION ductwork_release_and_claim_3(
    p_key text, p_owner text, p_ends text[], p_outcome text, p_error_klass text,
    p_error_message text, p_error_backtrace text, p_take integer, p_poll boolean,
    p_now timestamp, p_offset_us bigint, p_entry jsonb, p_digest text, p_keys jsonb,
    p_unconfigured text, p_family text, p_family_ceiling integer)
RETURNS TABLE (r_status text, r_now timestamp, r_stamp boolean, r_blocked_us bigint, r_unconfigured boolean,
               r_execution_id text, r_step_id text,
               r_idempotency_key text, r_run_id text, r_branch_id text, r_node text, r_klass text,
               r_pipeline_klass text, r_definition_sha1 text, r_input_json text, r_limit_key text,
               r_timeout_us bigint, r_retry_count integer, r_crash_count integer)
LANGUAGE plpgsql AS $routine$
DECLARE
    v_lane text := coalesce(p_key, '');
    v_seq bigint;
    v_seq0 bigint;
    v_digest text;
    v_now timestamp;
    v_now_us bigint;
    v_count integer;
    v_in_flight integer := 0;
    v_family_in_flight integer := 0;
    v_ids text[] := '{}';
    v_ats timestamp[] := '{}';
    v_bound_at timestamp;
    v_bound_id text;
    v_walk_lane text;
    v_walk_at timestamp;
    v_walk_id text;
    v_passed text[] := '{}';
    v_claims text[] := '{}';
    v_status text;
    v_found boolean := true;
    v_rebase boolean := false;
    v_stamp boolean := false;
    v_blocked bigint;
    v_write_buckets boolean := false;
    v_unconfigured boolean := false;
    v_concurrency integer;
    v_limit bigint[];
    v_per bigint[];
    v_burst bigint[];
    v_level bigint[];
    v_time bigint[];
    d record;
    v_next record;
BEGIN
    IF p_family IS NOT NULL AND p_take > 0 THEN  -- [INV-LIM-8] the family's lock first, then the partition's, always
        PERFORM 1 FROM ductwork_limit_keys k WHERE k.key = p_family FOR UPDATE;
        IF NOT FOUND THEN  -- created with its partitions' rows
            RAISE EXCEPTION 'limit key family % has no row', p_family;
        END IF;
    END IF;
    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read
        SELECT k.seq, k.config_digest INTO v_seq, v_digest
          FROM ductwork_limit_keys k WHERE k.key = p_key FOR UPDATE;
        IF NOT FOUND AND p_take > 0 AND strpos(p_key, '[') > 0 THEN  -- [INV-LIM-9] a partition forgotten after an
            -- enqueue read its row: created again, locked
            INSERT INTO ductwork_limit_keys AS n (key, seq, created_at, updated_at)
                 VALUES (p_key, 0, coalesce(p_now, now() AT TIME ZONE 'UTC'), coalesce(p_now, now() AT TIME ZONE 'UTC'))
            ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key  -- (created meanwhile: locked all the same)
            RETURNING n.seq, n.config_digest INTO v_seq, v_digest;
        END IF;
        IF v_seq = 0 AND strpos(p_key, '[') > 0 THEN  -- [INV-CLK-1] a new partition row numbers on from its family's
            v_seq := coalesce((SELECT f.seq FROM ductwork_limit_keys f WHERE f.key = split_part(p_key, '[', 1)), 0);
        END IF;
        IF v_seq IS NULL THEN
            IF cardinality(p_ends) > 0 THEN
                RAISE EXCEPTION 'limit key % has no row', p_key;
            END IF;
            v_found := false;
            IF p_poll THEN
                v_status := 'gone';
            END IF;
        END IF;
    END IF;
    -- [INV-CLK-1] the clock, read once the key's lock is held
    v_now := coalesce(p_now, (clock_timestamp() AT TIME ZONE 'UTC') + p_offset_us * interval '1 microsecond');
    v_now_us := (extract(epoch FROM v_now) * 1000000)::bigint;
    v_seq0 := v_seq;
    IF v_found AND cardinality(p_ends) > 0 THEN  -- the endings, guarded [INV-EXE-2]
        UPDATE ductwork_executions e
           SET completed_at = v_now, updated_at = v_now, outcome = p_outcome,
               release_seq = v_seq + o.ord,  -- [INV-CLK-1] each its own seq, in the order given (NULL: unkeyed)
               error_klass = p_error_klass, error_message = p_error_message, error_backtrace = p_error_backtrace
          FROM unnest(p_ends) WITH ORDINALITY AS o(id, ord)
         WHERE e.id = o.id
           AND e.completed_at IS NULL  -- [INV-EXE-2] still open: not already ended
           AND e.claimed_at IS NOT NULL  -- claimed: a pending execution has no outcome
           AND e.process_id IS NOT DISTINCT FROM p_owner;  -- [INV-EXE-2] still the owner's (NULL: an orphan's)
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count <> cardinality(p_ends) THEN  -- [INV-EXE-2] fewer: one was taken; the caller rolls back
            RETURN QUERY SELECT 'taken'::text, v_now, false, NULL::bigint, false, NULL::text,
                NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
                NULL::text, NULL::text, NULL::bigint, NULL::integer, NULL::integer;
            RETURN;
        END IF;
        v_seq := v_seq + v_count;  -- [INV-LIM-3] the slots are free: in-flight derives from completed_at
    END IF;
    IF v_found AND p_take > 0 THEN
        IF p_key IS NULL THEN  -- the unkeyed lane's oldest eligible, skipping rows other claimers hold
            SELECT coalesce(array_agg(s.id ORDER BY s.eligible_at, s.id), '{}'),
                   coalesce(array_agg(s.eligible_at ORDER BY s.eligible_at, s.id), '{}')
              INTO v_ids, v_ats
              FROM (SELECT e.id, e.eligible_at FROM ductwork_executions e
                     WHERE e.pending_lane = ''  -- pending in the unkeyed lane
                       AND e.eligible_at <= v_now  -- eligible: delays and back-off have passed
                     ORDER BY e.eligible_at, e.id  -- [INV-LIM-6] FIFO within the lane
                     LIMIT p_take FOR UPDATE SKIP LOCKED) s;
        ELSE  -- [INV-LIM-1] the key's oldest eligible and its in-flight count, under its lock
            SELECT coalesce(array_agg(s.id ORDER BY s.eligible_at, s.id), '{}'),
                   coalesce(array_agg(s.eligible_at ORDER BY s.eligible_at, s.id), '{}')
              INTO v_ids, v_ats
              FROM (SELECT e.id, e.eligible_at FROM ductwork_executions e
                     WHERE e.pending_lane = p_key  -- pending in this key's lane
                       AND e.eligible_at <= v_now  -- eligible: delays and back-off have passed
                     ORDER BY e.eligible_at, e.id  -- [INV-LIM-6] FIFO within the lane
                     LIMIT p_take) s;
            SELECT count(*) INTO v_in_flight FROM ductwork_executions e WHERE e.inflight_key = p_key;  -- [INV-LIM-1]
            IF p_family IS NOT NULL THEN  -- [INV-LIM-8] the family's in flight, over all its partitions, under its lock
                SELECT count(*) INTO v_family_in_flight FROM ductwork_executions e
                 WHERE e.inflight_key IS NOT NULL
                   AND left(e.inflight_key, length(p_family) + 1) = p_family || '[';  -- a partition of p_family
            END IF;
        END IF;
        IF cardinality(v_ids) = 0 THEN
            IF p_poll THEN
                v_status := 'gone';
            END IF;
        ELSE
            IF NOT p_poll OR p_take > 1 THEN  -- [INV-LIM-6] the oldest of every other lane a poll would try now
                LOOP  -- the pending executions of other lanes in poll order, a lane at a time
                    SELECT e.pending_lane, e.eligible_at, e.id::text INTO v_walk_lane, v_walk_at, v_walk_id
                      FROM ductwork_executions e
                     WHERE e.claimed_at IS NULL  -- pending
                       AND e.eligible_at <= v_ats[cardinality(v_ats)]  -- no later than the candidates (eligible)
                       AND e.pending_lane <> v_lane AND e.pending_lane <> ALL (v_passed)  -- a lane not yet tried
                       AND (v_walk_id IS NULL OR (e.eligible_at, e.id) > (v_walk_at, v_walk_id))
                     ORDER BY e.eligible_at, e.id LIMIT 1;  -- [INV-LIM-6] the next lane's oldest
                    EXIT WHEN NOT FOUND  -- no other lane has eligible work
                         OR (v_walk_at, v_walk_id) > (v_ats[cardinality(v_ats)], v_ids[cardinality(v_ids)]);  -- none older
                    IF v_walk_lane = '' OR EXISTS (  -- the unkeyed lane, or a key that may admit now
                        SELECT 1
                          FROM (SELECT v_walk_lane AS key) l
                          LEFT JOIN ductwork_limit_keys k ON k.key = l.key  -- (no row yet: never stamped)
                          LEFT JOIN jsonb_to_recordset(p_keys) AS s(k text, c integer, d text, p boolean)
                            ON s.k = l.key AND s.p IS NOT TRUE  -- a static key's entry
                          LEFT JOIN jsonb_to_recordset(p_keys) AS m(k text, c integer, d text, p boolean, f integer)
                            ON m.k = split_part(l.key, '[', 1) AND m.p AND strpos(l.key, '[') > 0  -- or a partition's family's
                          CROSS JOIN LATERAL (SELECT coalesce(s.c, m.c) AS c, coalesce(s.d, m.d) AS d, m.f, m.k AS family) c
                         WHERE (k.blocked_until IS NULL  -- never rate-blocked
                                OR k.blocked_until <= v_now  -- or its next token has arrived [INV-LIM-5]
                                OR coalesce(k.config_digest, '') <> coalesce(c.d, p_unconfigured))  -- or stamped under other values
                           AND (c.c IS NULL  -- no ceiling, or not saturated [INV-LIM-1]
                                OR (SELECT count(*) FROM ductwork_executions f WHERE f.inflight_key = l.key) < c.c)
                           AND (c.f IS NULL  -- no family ceiling, or its family not at it [INV-LIM-8]
                                OR (SELECT count(*) FROM ductwork_executions g
                                     WHERE g.inflight_key IS NOT NULL
                                       AND left(g.inflight_key, length(c.family) + 1) = c.family || '[') < c.f)) THEN
                        v_bound_at := v_walk_at;
                        v_bound_id := v_walk_id;
                        EXIT;
                    END IF;
                    v_passed := v_passed || v_walk_lane;  -- saturated or rate-blocked: its other executions are later
                END LOOP;
            END IF;
            IF NOT p_poll AND v_bound_id IS NOT NULL AND (v_bound_at, v_bound_id) < (v_ats[1], v_ids[1]) THEN
                NULL;  -- [INV-LIM-6] a poll now would try another lane first: no hand-off, nothing written
            ELSIF p_key IS NULL THEN  -- the unkeyed lane admits what the poll order lets it take
                v_claims := ARRAY[v_ids[1]];
                FOR i IN 2 .. cardinality(v_ids) LOOP
                    EXIT WHEN v_bound_id IS NOT NULL AND (v_ats[i], v_ids[i]) >= (v_bound_at, v_bound_id);  -- [INV-LIM-6]
                    v_claims := v_claims || v_ids[i];
                END LOOP;
            ELSE
                v_rebase := v_digest IS DISTINCT FROM p_digest;
                IF v_rebase AND NOT p_poll THEN  -- a hand-off leaves a key stored under other values to a poll
                    v_rebase := false;
                ELSIF p_family_ceiling IS NOT NULL AND v_family_in_flight >= p_family_ceiling THEN  -- [INV-LIM-8]
                    v_rebase := false;  -- the family first: nothing read, refilled, re-based or stamped
                    IF p_poll THEN
                        v_status := 'family_concurrency';
                    END IF;
                ELSE
                    v_concurrency := (p_entry ->> 'c')::integer;
                    SELECT coalesce(array_agg((r ->> 0)::bigint ORDER BY n), '{}'),
                           coalesce(array_agg((r ->> 1)::bigint ORDER BY n), '{}'),
                           coalesce(array_agg((r ->> 2)::bigint ORDER BY n), '{}'),
                           coalesce(array_agg(b.level_units ORDER BY n), '{}'),
                           coalesce(array_agg(b.refilled_at_us ORDER BY n), '{}')
                      INTO v_limit, v_per, v_burst, v_level, v_time
                      FROM jsonb_array_elements(coalesce(p_entry -> 'r', '[]')) WITH ORDINALITY AS x(r, n)
                      LEFT JOIN ductwork_limit_buckets b ON b.key = p_key AND b.period_s = (r ->> 1)::integer;
                    d := ductwork_decide_3(p_entry IS NOT NULL, v_concurrency, v_limit, v_per, v_burst, v_level,
                                           v_time, v_in_flight, v_now_us);
                    IF d.refused = 'concurrency' THEN  -- [INV-LIM-1] a poll writes only its re-base, a hand-off nothing
                        IF p_poll THEN
                            v_status := 'concurrency';
                            v_stamp := v_rebase;
                        END IF;
                    ELSIF NOT d.admitted THEN  -- [INV-LIM-5] a poll's refusal writes its refill and stamp
                        IF p_poll THEN
                            v_status := 'rate';
                            v_stamp := d.stamp;
                            v_blocked := d.blocked_us;
                            v_level := d.level;
                            v_time := d.refilled_at;
                            v_write_buckets := true;
                        END IF;
                    ELSE
                        v_claims := ARRAY[v_ids[1]];
                        FOR i IN 2 .. cardinality(v_ids) LOOP
                            EXIT WHEN v_bound_id IS NOT NULL AND (v_ats[i], v_ids[i]) >= (v_bound_at, v_bound_id);  -- [INV-LIM-6]
                            EXIT WHEN p_family_ceiling IS NOT NULL  -- [INV-LIM-8] the family would be at its ceiling
                                      AND v_family_in_flight + cardinality(v_claims) >= p_family_ceiling;
                            v_next := ductwork_decide_3(p_entry IS NOT NULL, v_concurrency, v_limit, v_per, v_burst,
                                                        d.level, d.refilled_at, v_in_flight + cardinality(v_claims),
                                                        v_now_us);
                            EXIT WHEN NOT v_next.admitted;  -- the next poll would be refused: the batch ends
                            d := v_next;
                            v_claims := v_claims || v_ids[i];
                        END LOOP;
                        v_stamp := d.stamp;
                        v_blocked := d.blocked_us;
                        v_level := d.level;
                        v_time := d.refilled_at;
                        v_write_buckets := true;
                        v_unconfigured := d.unconfigured;
                    END IF;
                END IF;
            END IF;
        END IF;
    END IF;
    IF cardinality(v_claims) > 0 THEN  -- the claims, each with the key's next sequence number
        UPDATE ductwork_executions e
           SET claimed_at = v_now, process_id = p_owner, claim_seq = v_seq + c.ord, updated_at = v_now
          FROM unnest(v_claims) WITH ORDINALITY AS c(id, ord)
         WHERE e.id = c.id AND e.claimed_at IS NULL;  -- still pending (read under the key's lock, or locked)
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count <> cardinality(v_claims) THEN
            RAISE EXCEPTION 'lane %: one of executions % was taken under its lock [INV-LIM-1]', v_lane, v_claims;
        END IF;
        v_seq := v_seq + v_count;
    END IF;
    IF p_key IS NOT NULL AND v_seq IS NOT NULL THEN
        IF v_rebase THEN  -- [INV-LIM-4] a re-base keeps only the periods the entry keeps
            DELETE FROM ductwork_limit_buckets b
             WHERE b.key = p_key
               AND b.period_s <> ALL (SELECT (r ->> 1)::integer
                                        FROM jsonb_array_elements(coalesce(p_entry -> 'r', '[]')) AS x(r));
        END IF;
        IF v_write_buckets AND cardinality(v_per) > 0 THEN  -- [INV-LIM-2] the spend commits with the claims
            INSERT INTO ductwork_limit_buckets AS b (key, period_s, level_units, refilled_at_us, updated_at)
            SELECT p_key, v_per[i], v_level[i], v_time[i], v_now FROM generate_subscripts(v_per, 1) AS i
            ON CONFLICT (key, period_s) DO UPDATE
               SET level_units = excluded.level_units, refilled_at_us = excluded.refilled_at_us,
                   updated_at = excluded.updated_at;
        END IF;
        IF v_seq <> v_seq0 OR v_stamp OR v_rebase THEN  -- the header row, once, with what changed
            UPDATE ductwork_limit_keys k
               SET seq = v_seq,
                   blocked_until = CASE WHEN v_stamp  -- [INV-LIM-5] the exact time of the next token, or cleared
                                        THEN timestamp '1970-01-01' + v_blocked * interval '1 microsecond'
                                        ELSE k.blocked_until END,
                   config_digest = CASE WHEN v_rebase THEN p_digest ELSE k.config_digest END,
                   updated_at = v_now
             WHERE k.key = p_key;
        END IF;
    END IF;
    RETURN QUERY
        SELECT v_status, v_now, v_stamp, v_blocked, v_unconfigured, e.id::text,
               s.id::text, coalesce(s.idempotency_key, s.id)::text, s.run_id::text, s.branch_id::text,
               s.node::text, s.klass::text, r.pipeline_klass::text, r.definition_sha1::text, s.input_args::text,
               e.limit_key::text, s.timeout_us, e.retry_count, e.crash_count
          FROM unnest(v_claims) WITH ORDINALITY AS c(id, ord)
          JOIN ductwork_executions e ON e.id = c.id
          JOIN ductwork_steps s ON s.id = e.step_id
          JOIN ductwork_runs r ON r.id = s.run_id
         ORDER BY c.ord;
    IF NOT FOUND THEN
        RETURN QUERY SELECT v_status, v_now, v_stamp, v_blocked, v_unconfigured, NULL::text,
            NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
            NULL::text, NULL::text, NULL::bigint, NULL::integer, NULL::integer;
    END IF;
END
$routine$;
