-- The lane routine on MySQL-family, version 3 (ductwork/limits/claims.py::release_and_claim): version 2
-- (ductwork/db/migrations/routines/release_and_claim_2.mysql.sql, key families: docs/semantics.md
-- §5.1) whose bound, the oldest of every other lane a poll would try now [INV-LIM-6], is read by
-- walking the pending executions in poll order from the oldest (ix_execution_pending_order)
-- until the first lane that may admit, instead of probing every key's row: its cost grows with
-- the pending executions older than the key's own, never with the number of keys (issue 34).
-- A refinement of ductwork/limits/plan.py::plan, checked against it state by state on this
-- database (tests/properties/test_refinement.py). Installed by migration 0014; a change is a
-- new version of the routine (a new name) in a new migration.

-- The key decision (buckets.decide) on one key's buckets: p_rates the kept rate entries in
-- config order ([[limit, per_s, burst], ...]); p_levels and p_times their stored levels and
-- refill times (JSON null: no bucket yet, created empty at now), replaced by the new ones.
CREATE PROCEDURE ductwork_decide_3(
    IN p_configured BOOLEAN, IN p_concurrency INT, IN p_rates JSON, IN p_in_flight INT, IN p_now_us BIGINT,
    INOUT p_levels JSON, INOUT p_times JSON,
    OUT o_admitted BOOLEAN, OUT o_refused VARCHAR(16), OUT o_stamp BOOLEAN, OUT o_blocked_us BIGINT,
    OUT o_unconfigured BOOLEAN)
BEGIN
    DECLARE n INT DEFAULT JSON_LENGTH(p_rates);
    DECLARE i INT DEFAULT 0;
    DECLARE lim BIGINT;
    DECLARE per BIGINT;
    DECLARE cap BIGINT;
    DECLARE lv BIGINT;
    DECLARE t BIGINT;
    DECLARE dt BIGINT;
    DECLARE missing BIGINT;
    DECLARE levels JSON DEFAULT JSON_ARRAY();
    DECLARE times JSON DEFAULT JSON_ARRAY();
    SET o_admitted = FALSE, o_refused = NULL, o_stamp = FALSE, o_blocked_us = NULL, o_unconfigured = FALSE;
    IF p_in_flight < 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '[INV-LIM-3] negative in-flight count';
    END IF;
    IF NOT p_configured THEN  -- 1. no entry: admitted unlimited, the stamp cleared
        SET o_admitted = TRUE, o_stamp = TRUE, o_unconfigured = TRUE, p_levels = JSON_ARRAY(), p_times = JSON_ARRAY();
    ELSEIF p_concurrency IS NOT NULL AND p_in_flight >= p_concurrency THEN  -- [INV-LIM-1] 2. nothing refilled, stamped
        SET o_refused = 'concurrency', p_levels = JSON_ARRAY(), p_times = JSON_ARRAY();
    ELSE
        WHILE i < n DO  -- 3. refill every kept bucket [INV-LIM-4]
            SET lim = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][0]')) AS SIGNED);
            SET per = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][1]')) AS SIGNED);
            SET cap = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][2]')) AS SIGNED) * per * 1000000;
            SET lv = COALESCE(CAST(JSON_VALUE(p_levels, CONCAT('$[', i, ']')) AS SIGNED), 0);
            SET t = COALESCE(CAST(JSON_VALUE(p_times, CONCAT('$[', i, ']')) AS SIGNED), p_now_us);
            IF lv < 0 THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '[INV-LIM-4] a bucket has a negative level';
            END IF;
            SET lv = LEAST(lv, cap);  -- [INV-LIM-4] clamp to the current burst
            SET dt = p_now_us - t;
            IF dt > 0 THEN  -- time that went backwards adds nothing
                IF dt >= (cap - lv + lim - 1) DIV lim THEN
                    SET lv = cap;
                ELSE
                    SET lv = lv + dt * lim;
                END IF;
            END IF;
            SET levels = JSON_ARRAY_APPEND(levels, '$', lv);
            SET times = JSON_ARRAY_APPEND(times, '$', GREATEST(t, p_now_us));  -- never moves backwards [INV-LIM-2]
            SET i = i + 1;
        END WHILE;
        SET i = 0;
        WHILE i < n DO  -- 4. the latest next-token time of the short buckets [INV-LIM-5]
            SET lim = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][0]')) AS SIGNED);
            SET missing = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][1]')) AS SIGNED) * 1000000
                          - CAST(JSON_VALUE(levels, CONCAT('$[', i, ']')) AS SIGNED);
            IF missing > 0 THEN
                SET o_blocked_us = GREATEST(COALESCE(o_blocked_us, 0),
                    CAST(JSON_VALUE(times, CONCAT('$[', i, ']')) AS SIGNED) + (missing + lim - 1) DIV lim);
            END IF;
            SET i = i + 1;
        END WHILE;
        IF o_blocked_us IS NOT NULL THEN  -- refused for rate, stamped with the exact next-token time
            SET o_refused = 'rate', o_stamp = TRUE;
        ELSE
            SET i = 0;
            WHILE i < n DO  -- 5. admitted: one token from every bucket [INV-LIM-2]
                SET levels = JSON_SET(levels, CONCAT('$[', i, ']'),
                    CAST(JSON_VALUE(levels, CONCAT('$[', i, ']')) AS SIGNED)
                    - CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][1]')) AS SIGNED) * 1000000);
                SET i = i + 1;
            END WHILE;
            SET i = 0;
            WHILE i < n DO  -- the stamp over the buckets now short, or cleared [INV-LIM-5]
                SET lim = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][0]')) AS SIGNED);
                SET missing = CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][1]')) AS SIGNED) * 1000000
                              - CAST(JSON_VALUE(levels, CONCAT('$[', i, ']')) AS SIGNED);
                IF missing > 0 THEN
                    SET o_blocked_us = GREATEST(COALESCE(o_blocked_us, 0),
                        CAST(JSON_VALUE(times, CONCAT('$[', i, ']')) AS SIGNED) + (missing + lim - 1) DIV lim);
                END IF;
                SET i = i + 1;
            END WHILE;
            SET o_admitted = TRUE, o_stamp = TRUE;
        END IF;
        SET p_levels = levels, p_times = times;
    END IF;
END
-- ---- (one statement each: the migration sends them one by one)

-- The routine: the parameters and the rows returned are those of the PostgreSQL function
-- (release_and_claim_3.postgresql.sql), lists as JSON text. p_keys: the config's keys for the
-- bound scan, [{"k": name, "c": concurrency|null, "d": digest}, ...], a family's marked
-- "p": true, with its per-partition concurrency and digest and its ceiling "f" (null: none).
-- p_family, p_family_ceiling: a partition's family and the family's ceiling over all its
-- partitions (both NULL: no partition, or a family without a ceiling) [INV-LIM-8].
CREATE PROCEDURE ductwork_release_and_claim_3(
    IN p_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN p_owner VARCHAR(36), IN p_ends JSON,
    IN p_outcome VARCHAR(16), IN p_error_klass VARCHAR(255), IN p_error_message VARCHAR(255),
    IN p_error_backtrace LONGTEXT, IN p_take INT, IN p_poll BOOLEAN, IN p_now DATETIME(6), IN p_offset_us BIGINT,
    IN p_entry JSON, IN p_digest VARCHAR(16), IN p_keys JSON, IN p_unconfigured VARCHAR(16),
    IN p_family VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN p_family_ceiling INT)
BEGIN
    DECLARE v_lane VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT COALESCE(p_key, '');
    DECLARE v_seq BIGINT;
    DECLARE v_seq0 BIGINT;
    DECLARE v_digest VARCHAR(16);
    DECLARE v_found BOOLEAN DEFAULT TRUE;
    DECLARE v_now DATETIME(6);
    DECLARE v_now_us BIGINT;
    DECLARE v_count INT;
    DECLARE v_n_ends INT DEFAULT COALESCE(JSON_LENGTH(p_ends), 0);
    DECLARE v_in_flight INT DEFAULT 0;
    DECLARE v_family_in_flight INT DEFAULT 0;
    DECLARE v_family_seq BIGINT;
    DECLARE v_ids JSON DEFAULT JSON_ARRAY();
    DECLARE v_ats JSON DEFAULT JSON_ARRAY();
    DECLARE v_n INT DEFAULT 0;
    DECLARE v_i INT;
    DECLARE v_id VARCHAR(36);
    DECLARE v_at DATETIME(6);
    DECLARE v_at_us BIGINT;
    DECLARE v_bound_at BIGINT;
    DECLARE v_bound_id VARCHAR(36);
    DECLARE v_walk_lane VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_walk_at DATETIME(6);
    DECLARE v_walk_us BIGINT;
    DECLARE v_walk_id VARCHAR(36);
    DECLARE v_last_us BIGINT;
    DECLARE v_last_at DATETIME(6);
    DECLARE v_last_id VARCHAR(36);
    DECLARE v_passed JSON DEFAULT JSON_ARRAY();
    DECLARE v_claims JSON DEFAULT JSON_ARRAY();
    DECLARE v_status VARCHAR(32);
    DECLARE v_rebase BOOLEAN DEFAULT FALSE;
    DECLARE v_stamp BOOLEAN DEFAULT FALSE;
    DECLARE v_blocked BIGINT;
    DECLARE v_write_buckets BOOLEAN DEFAULT FALSE;
    DECLARE v_unconfigured BOOLEAN DEFAULT FALSE;
    DECLARE v_concurrency INT;
    DECLARE v_rates JSON;
    DECLARE v_levels JSON;
    DECLARE v_times JSON;
    DECLARE v_levels2 JSON;
    DECLARE v_level BIGINT;
    DECLARE v_time BIGINT;
    DECLARE v_times2 JSON;
    DECLARE d_admitted BOOLEAN;
    DECLARE d_refused VARCHAR(16);
    DECLARE d_stamp BOOLEAN;
    DECLARE d_blocked BIGINT;
    DECLARE d_unconfigured BOOLEAN;
    DECLARE v_done BOOLEAN DEFAULT FALSE;
    -- the unkeyed lane's oldest eligible, skipping rows other claimers hold
    DECLARE unkeyed CURSOR FOR
        SELECT e.id, e.eligible_at FROM ductwork_executions e
         WHERE e.pending_lane = ''  -- pending in the unkeyed lane
           AND e.eligible_at <= v_now  -- eligible: delays and back-off have passed
         ORDER BY e.eligible_at, e.id  -- [INV-LIM-6] FIFO within the lane
         LIMIT p_take FOR UPDATE SKIP LOCKED;
    -- [INV-LIM-1] the key's oldest eligible, under its lock
    DECLARE keyed CURSOR FOR
        SELECT e.id, e.eligible_at FROM ductwork_executions e
         WHERE e.pending_lane = p_key  -- pending in this key's lane
           AND e.eligible_at <= v_now  -- eligible: delays and back-off have passed
         ORDER BY e.eligible_at, e.id  -- [INV-LIM-6] FIFO within the lane
         LIMIT p_take;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;

    IF p_family IS NOT NULL AND p_take > 0 THEN  -- [INV-LIM-8] the family's lock first, then the partition's
        SELECT k.seq INTO v_family_seq
          FROM ductwork_limit_keys k WHERE k.`key` = p_family FOR UPDATE;
        IF v_done THEN  -- [INV-LIM-8] a family's row is written with its partitions' rows
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'a key family has no row';
        END IF;
    END IF;
    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read
        SELECT k.seq, k.config_digest INTO v_seq, v_digest
          FROM ductwork_limit_keys k WHERE k.`key` = p_key FOR UPDATE;
        IF v_done AND p_take > 0 AND LOCATE('[', p_key) > 0 THEN  -- [INV-LIM-9] a partition forgotten after an
            -- enqueue read its row: created again, locked
            INSERT INTO ductwork_limit_keys (`key`, seq, created_at, updated_at)
                 VALUES (p_key, 0, COALESCE(p_now, UTC_TIMESTAMP(6)), COALESCE(p_now, UTC_TIMESTAMP(6)))
                 ON DUPLICATE KEY UPDATE `key` = VALUES(`key`);  -- (created meanwhile: locked all the same)
            SET v_done = FALSE;
            SELECT n.seq, n.config_digest INTO v_seq, v_digest FROM ductwork_limit_keys n WHERE n.`key` = p_key;
        END IF;
        IF v_seq = 0 AND LOCATE('[', p_key) > 0 THEN  -- [INV-CLK-1] a new partition row numbers on from its family's
            SET v_seq = COALESCE((SELECT f.seq FROM ductwork_limit_keys f
                                   WHERE f.`key` = SUBSTRING_INDEX(p_key, '[', 1)), 0);
        END IF;
        IF v_done THEN
            IF v_n_ends > 0 THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'a limit key has no row';
            END IF;
            SET v_found = FALSE;
            IF p_poll THEN
                SET v_status = 'gone';
            END IF;
        END IF;
    END IF;
    -- [INV-CLK-1] the clock, read once the key's lock is held
    SET v_now = COALESCE(p_now, TIMESTAMPADD(MICROSECOND, p_offset_us, UTC_TIMESTAMP(6)));
    SET v_now_us = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_now);
    SET v_seq0 = v_seq;
    IF v_found AND v_n_ends > 0 THEN  -- the endings, guarded [INV-EXE-2]
        UPDATE ductwork_executions e
          JOIN JSON_TABLE(p_ends, '$[*]' COLUMNS (ord FOR ORDINALITY, id VARCHAR(36) PATH '$')) o ON e.id = o.id
           SET e.completed_at = v_now, e.updated_at = v_now, e.outcome = p_outcome,
               e.release_seq = v_seq + o.ord,  -- [INV-CLK-1] each its own seq, in the order given (NULL: unkeyed)
               e.error_klass = p_error_klass, e.error_message = p_error_message,
               e.error_backtrace = p_error_backtrace
         WHERE e.completed_at IS NULL  -- [INV-EXE-2] still open: not already ended
           AND e.claimed_at IS NOT NULL  -- claimed: a pending execution has no outcome
           AND e.process_id <=> p_owner;  -- [INV-EXE-2] still the owner's (NULL: an orphan's)
        SET v_count = ROW_COUNT();
        IF v_count <> v_n_ends THEN  -- [INV-EXE-2] fewer: one was taken; the caller rolls back
            SET v_status = 'taken';
        ELSE
            SET v_seq = v_seq + v_count;  -- [INV-LIM-3] the slots are free: in-flight derives from completed_at
        END IF;
    END IF;
    IF v_found AND v_status IS NULL AND p_take > 0 THEN
        SET v_done = FALSE;
        IF p_key IS NULL THEN
            OPEN unkeyed;
            reading: LOOP
                FETCH unkeyed INTO v_id, v_at;
                IF v_done THEN LEAVE reading; END IF;
                SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', v_id),
                    v_ats = JSON_ARRAY_APPEND(v_ats, '$', TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_at));
            END LOOP;
            CLOSE unkeyed;
        ELSE
            OPEN keyed;
            reading: LOOP
                FETCH keyed INTO v_id, v_at;
                IF v_done THEN LEAVE reading; END IF;
                SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', v_id),
                    v_ats = JSON_ARRAY_APPEND(v_ats, '$', TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_at));
            END LOOP;
            CLOSE keyed;
            SELECT COUNT(*) INTO v_in_flight FROM ductwork_executions e WHERE e.inflight_key = p_key;  -- [INV-LIM-1]
            IF p_family IS NOT NULL THEN  -- [INV-LIM-8] the family's in flight, over all its partitions
                SELECT COUNT(*) INTO v_family_in_flight FROM ductwork_executions e
                 WHERE e.inflight_key IS NOT NULL  -- in flight (few rows)
                   AND LEFT(e.inflight_key, CHAR_LENGTH(p_family) + 1) = CONCAT(p_family, '[');  -- [INV-LIM-8]
            END IF;
        END IF;
        SET v_n = JSON_LENGTH(v_ids);
        IF v_n = 0 THEN
            IF p_poll THEN
                SET v_status = 'gone';
            END IF;
        ELSE
            IF NOT p_poll OR p_take > 1 THEN  -- [INV-LIM-6] the oldest of every other lane a poll would try now
                SET v_done = FALSE;
                SET v_last_us = CAST(JSON_VALUE(v_ats, CONCAT('$[', v_n - 1, ']')) AS SIGNED),
                    v_last_id = JSON_VALUE(v_ids, CONCAT('$[', v_n - 1, ']'));
                SET v_last_at = TIMESTAMPADD(MICROSECOND, v_last_us, '1970-01-01 00:00:00');
                walking: LOOP  -- the pending executions of other lanes in poll order, a lane at a time
                    SELECT e.pending_lane, e.eligible_at, e.id INTO v_walk_lane, v_walk_at, v_walk_id
                      FROM ductwork_executions e
                     WHERE e.claimed_at IS NULL  -- pending
                       AND e.eligible_at <= v_last_at  -- no later than the candidates (eligible)
                       AND e.pending_lane <> v_lane  -- another lane
                       AND NOT JSON_CONTAINS(v_passed, JSON_QUOTE(e.pending_lane))  -- not yet tried
                       AND (v_walk_id IS NULL OR e.eligible_at > v_walk_at
                            OR (e.eligible_at = v_walk_at AND e.id > v_walk_id))
                     ORDER BY e.eligible_at, e.id LIMIT 1;  -- [INV-LIM-6] the next lane's oldest
                    IF v_done THEN  -- no other lane has eligible work
                        LEAVE walking;
                    END IF;
                    SET v_walk_us = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_walk_at);
                    IF (v_walk_us, v_walk_id) > (v_last_us, v_last_id) THEN  -- none older than the candidates
                        LEAVE walking;
                    END IF;
                    IF v_walk_lane = '' OR EXISTS (  -- the unkeyed lane, or a key that may admit now
                        SELECT 1
                          FROM (SELECT v_walk_lane AS `key`) l
                          LEFT JOIN ductwork_limit_keys k ON k.`key` = l.`key`  -- (no row yet: never stamped)
                          LEFT JOIN JSON_TABLE(p_keys, '$[*]' COLUMNS (
                              k VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.k',
                              c INT PATH '$.c', d VARCHAR(16) PATH '$.d', p INT EXISTS PATH '$.p', f INT PATH '$.f')) c
                            ON (c.p = 0 AND c.k = l.`key`)  -- a static key's entry, or a partition's family's
                            OR (c.p = 1 AND LEFT(l.`key`, CHAR_LENGTH(c.k) + 1) = CONCAT(c.k, '['))  -- [INV-LIM-8]
                         WHERE (k.blocked_until IS NULL  -- never rate-blocked
                                OR k.blocked_until <= v_now  -- or its next token has arrived [INV-LIM-5]
                                OR COALESCE(k.config_digest, '') <> COALESCE(c.d, p_unconfigured))  -- or stamped under other values
                           AND (c.c IS NULL  -- no ceiling, or not saturated [INV-LIM-1]
                                OR (SELECT COUNT(*) FROM ductwork_executions f WHERE f.inflight_key = l.`key`) < c.c)
                           AND (c.f IS NULL  -- no family ceiling, or the family not at it [INV-LIM-8]
                                OR (SELECT COUNT(*) FROM ductwork_executions g
                                     WHERE g.inflight_key IS NOT NULL
                                       AND LEFT(g.inflight_key, CHAR_LENGTH(c.k) + 1) = CONCAT(c.k, '[')) < c.f)) THEN
                        SET v_bound_at = v_walk_us, v_bound_id = v_walk_id;
                        LEAVE walking;
                    END IF;
                    SET v_passed = JSON_ARRAY_APPEND(v_passed, '$', v_walk_lane);  -- saturated or rate-blocked
                END LOOP;
                SET v_done = FALSE;
            END IF;
            SET v_at_us = CAST(JSON_VALUE(v_ats, '$[0]') AS SIGNED), v_id = JSON_VALUE(v_ids, '$[0]');
            IF NOT p_poll AND v_bound_id IS NOT NULL AND (v_bound_at, v_bound_id) < (v_at_us, v_id) THEN
                SET v_n = 0;  -- [INV-LIM-6] a poll now would try another lane first: no hand-off, nothing written
            ELSEIF p_key IS NULL THEN  -- the unkeyed lane admits what the poll order lets it take
                SET v_claims = JSON_ARRAY(v_id), v_i = 1;
                claiming: WHILE v_i < v_n DO
                    SET v_at_us = CAST(JSON_VALUE(v_ats, CONCAT('$[', v_i, ']')) AS SIGNED),
                        v_id = JSON_VALUE(v_ids, CONCAT('$[', v_i, ']'));
                    IF v_bound_id IS NOT NULL AND (v_at_us, v_id) >= (v_bound_at, v_bound_id) THEN
                        LEAVE claiming;  -- [INV-LIM-6]
                    END IF;
                    SET v_claims = JSON_ARRAY_APPEND(v_claims, '$', v_id), v_i = v_i + 1;
                END WHILE;
            ELSE
                SET v_rebase = NOT (v_digest <=> p_digest);
                IF v_rebase AND NOT p_poll THEN  -- a hand-off leaves a key stored under other values to a poll
                    SET v_rebase = FALSE;
                ELSEIF p_family_ceiling IS NOT NULL AND v_family_in_flight >= p_family_ceiling THEN  -- [INV-LIM-8]
                    SET v_rebase = FALSE;  -- the family at its ceiling: nothing read or written, no re-base
                    IF p_poll THEN
                        SET v_status = 'family_concurrency';
                    END IF;
                ELSE
                    SET v_concurrency = CAST(JSON_VALUE(p_entry, '$.c') AS SIGNED);
                    SET v_rates = COALESCE(JSON_EXTRACT(p_entry, '$.r'), JSON_ARRAY());
                    SET v_levels = JSON_ARRAY(), v_times = JSON_ARRAY(), v_i = 0;
                    WHILE v_i < JSON_LENGTH(v_rates) DO  -- each kept entry's stored bucket, config order
                        SET v_level = NULL, v_time = NULL;
                        SELECT b.level_units, b.refilled_at_us INTO v_level, v_time FROM ductwork_limit_buckets b
                         WHERE b.`key` = p_key AND b.period_s = JSON_VALUE(v_rates, CONCAT('$[', v_i, '][1]'));
                        SET v_levels = JSON_ARRAY_APPEND(v_levels, '$', v_level),
                            v_times = JSON_ARRAY_APPEND(v_times, '$', v_time), v_i = v_i + 1;
                    END WHILE;
                    SET v_done = FALSE;
                    CALL ductwork_decide_3(p_entry IS NOT NULL, v_concurrency, v_rates, v_in_flight, v_now_us,
                                           v_levels, v_times, d_admitted, d_refused, d_stamp, d_blocked,
                                           d_unconfigured);
                    IF d_refused = 'concurrency' THEN  -- [INV-LIM-1] a poll writes only its re-base, a hand-off nothing
                        IF p_poll THEN
                            SET v_status = 'concurrency', v_stamp = v_rebase;
                        END IF;
                    ELSEIF NOT d_admitted THEN  -- [INV-LIM-5] a poll's refusal writes its refill and stamp
                        IF p_poll THEN
                            SET v_status = 'rate', v_stamp = d_stamp, v_blocked = d_blocked, v_write_buckets = TRUE;
                        END IF;
                    ELSE
                        SET v_claims = JSON_ARRAY(v_id), v_i = 1;
                        SET v_stamp = d_stamp, v_blocked = d_blocked, v_unconfigured = d_unconfigured;
                        claiming: WHILE v_i < v_n DO
                            SET v_at_us = CAST(JSON_VALUE(v_ats, CONCAT('$[', v_i, ']')) AS SIGNED),
                                v_id = JSON_VALUE(v_ids, CONCAT('$[', v_i, ']'));
                            IF v_bound_id IS NOT NULL AND (v_at_us, v_id) >= (v_bound_at, v_bound_id) THEN
                                LEAVE claiming;  -- [INV-LIM-6]
                            END IF;
                            IF p_family_ceiling IS NOT NULL
                               AND v_family_in_flight + JSON_LENGTH(v_claims) >= p_family_ceiling THEN
                                LEAVE claiming;  -- [INV-LIM-8] the family would be at its ceiling: the batch ends
                            END IF;
                            SET v_levels2 = v_levels, v_times2 = v_times;
                            CALL ductwork_decide_3(p_entry IS NOT NULL, v_concurrency, v_rates,
                                                   v_in_flight + JSON_LENGTH(v_claims), v_now_us, v_levels2, v_times2,
                                                   d_admitted, d_refused, d_stamp, d_blocked, d_unconfigured);
                            IF NOT d_admitted THEN
                                LEAVE claiming;  -- the next poll would be refused: the batch ends
                            END IF;
                            SET v_levels = v_levels2, v_times = v_times2, v_stamp = d_stamp, v_blocked = d_blocked;
                            SET v_claims = JSON_ARRAY_APPEND(v_claims, '$', v_id), v_i = v_i + 1;
                        END WHILE;
                        SET v_write_buckets = TRUE;
                    END IF;
                END IF;
            END IF;
        END IF;
    END IF;
    IF v_status IS NULL OR v_status <> 'taken' THEN
        IF JSON_LENGTH(v_claims) > 0 THEN  -- the claims, each with the key's next sequence number
            UPDATE ductwork_executions e
              JOIN JSON_TABLE(v_claims, '$[*]' COLUMNS (ord FOR ORDINALITY, id VARCHAR(36) PATH '$')) c ON e.id = c.id
               SET e.claimed_at = v_now, e.process_id = p_owner, e.claim_seq = v_seq + c.ord, e.updated_at = v_now
             WHERE e.claimed_at IS NULL;  -- still pending (read under the key's lock, or locked)
            SET v_count = ROW_COUNT();
            IF v_count <> JSON_LENGTH(v_claims) THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'an execution was taken under its lock [INV-LIM-1]';
            END IF;
            SET v_seq = v_seq + v_count;
        END IF;
        IF p_key IS NOT NULL AND v_found THEN
            IF v_rebase THEN  -- [INV-LIM-4] a re-base keeps only the periods the entry keeps
                DELETE FROM ductwork_limit_buckets
                 WHERE `key` = p_key
                   AND period_s NOT IN (SELECT r.per FROM JSON_TABLE(COALESCE(JSON_EXTRACT(p_entry, '$.r'), JSON_ARRAY()),
                                            '$[*]' COLUMNS (per INT PATH '$[1]')) r);
            END IF;
            IF v_write_buckets AND JSON_LENGTH(v_levels) > 0 THEN  -- [INV-LIM-2] the spend commits with the claims
                INSERT INTO ductwork_limit_buckets (`key`, period_s, level_units, refilled_at_us, updated_at)
                SELECT p_key, r.per, CAST(JSON_VALUE(v_levels, CONCAT('$[', r.n - 1, ']')) AS SIGNED),
                       CAST(JSON_VALUE(v_times, CONCAT('$[', r.n - 1, ']')) AS SIGNED), v_now
                  FROM JSON_TABLE(v_rates, '$[*]' COLUMNS (n FOR ORDINALITY, per INT PATH '$[1]')) r
                ON DUPLICATE KEY UPDATE level_units = VALUES(level_units), refilled_at_us = VALUES(refilled_at_us),
                                        updated_at = VALUES(updated_at);
            END IF;
            IF v_seq <> v_seq0 OR v_stamp OR v_rebase THEN  -- the header row, once, with what changed
                UPDATE ductwork_limit_keys k
                   SET k.seq = v_seq,
                       k.blocked_until = CASE WHEN v_stamp  -- [INV-LIM-5] the exact time of the next token, or cleared
                                              THEN TIMESTAMPADD(MICROSECOND, v_blocked, '1970-01-01 00:00:00')
                                              ELSE k.blocked_until END,
                       k.config_digest = CASE WHEN v_rebase THEN p_digest ELSE k.config_digest END,
                       k.updated_at = v_now
                 WHERE k.`key` = p_key;
            END IF;
        END IF;
    END IF;
    SELECT c.ord AS r_ord, v_status AS r_status, v_now AS r_now, v_stamp AS r_stamp, v_blocked AS r_blocked_us,
           v_unconfigured AS r_unconfigured, e.id AS r_execution_id, s.id AS r_step_id,
           COALESCE(s.idempotency_key, s.id) AS r_idempotency_key, s.run_id AS r_run_id,
           s.branch_id AS r_branch_id, s.node AS r_node, s.klass AS r_klass, r.pipeline_klass AS r_pipeline_klass,
           r.definition_sha1 AS r_definition_sha1, s.input_args AS r_input_json, e.limit_key AS r_limit_key,
           s.timeout_us AS r_timeout_us, e.retry_count AS r_retry_count, e.crash_count AS r_crash_count
      FROM JSON_TABLE(v_claims, '$[*]' COLUMNS (ord FOR ORDINALITY, id VARCHAR(36) PATH '$')) c
      JOIN ductwork_executions e ON e.id = c.id
      JOIN ductwork_steps s ON s.id = e.step_id
      JOIN ductwork_runs r ON r.id = s.run_id
     WHERE v_status IS NULL OR v_status <> 'taken'
    UNION ALL
    SELECT 0, v_status, v_now, v_stamp, v_blocked, v_unconfigured, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
      FROM DUAL WHERE JSON_LENGTH(v_claims) = 0 OR v_status = 'taken'
    ORDER BY r_ord;
END
