-- The head rows' writers (issue 20, point 5; docs/tenants.md). Applied idempotently on
-- every migrate.
--
-- Every append advances its partitions' head rows (stream_partitions.next_offset; L1)
-- through these functions, never by an UPDATE of its own: streamd.append,
-- streamd.append_versioned, the offset trigger of plain INSERTs, append_reserve and
-- append_reserve_producer (the COPY paths), and so the advisories (streamd.advise
-- appends). They are SECURITY DEFINER functions of the tables' owner, so a role bound
-- to a tenant appends without any write privilege on stream_partitions, and can move
-- a head only as an append does: forward by what it reserves, back only over offsets
-- its own transaction reserved and left unused. Their search_path is pinned and they
-- run no dynamic SQL. EXECUTE is not PUBLIC: bind_tenant_role grants it (and the
-- statement at the end to roles bound before); another role that appends and is not
-- the owner needs it granted (docs/tenants.md).
--
-- Cost: a call per partition of a batch (per row for plain INSERTs), where the UPDATE
-- used to be inline; the SET search_path of each call is the only extra work.

-- Migrations and bindings both change these functions' privileges (pg_proc rows):
-- serialise them with bind_tenant_role's lock, held until the migration commits.
SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));

-- Reserves p_count offsets (at least 1) on partition p_partition of p_stream_name:
-- advances the head row, which stays locked until the calling transaction ends (L1),
-- and returns the first offset reserved and the log time of the batch (monotonic per
-- partition). Both are NULL when the partition does not exist (the caller raises
-- raise_partition_missing's error: the stream may have been deleted while it waited).
-- Records the calling transaction as the head's reserver, for head_give_back.
CREATE OR REPLACE FUNCTION streamd.head_reserve(p_stream_name text, p_partition integer, p_count integer,
                                                OUT base bigint, OUT ts timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_count IS NULL OR p_count < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('reserve offsets on %s/%s: the count %s must be at least 1', p_stream_name, p_partition, p_count);
    END IF;
    UPDATE streamd.stream_partitions h
       SET next_offset = h.next_offset + p_count,
           last_appended_at = greatest(clock_timestamp(), h.last_appended_at),
           reserved_from = CASE WHEN h.reserved_by = pg_current_xact_id() THEN h.reserved_from ELSE h.next_offset END,
           reserved_by = pg_current_xact_id()
     WHERE h.stream_name = p_stream_name AND h.partition = p_partition
    RETURNING h.next_offset - p_count, h.last_appended_at INTO base, ts;
END;
$$;

-- Moves the head of p_stream_name/p_partition back to p_next: gives back the offsets
-- at and above p_next that the calling transaction reserved and did not use (an event
-- id found stored after its offset was taken). Refused (SD005) unless this
-- transaction reserved every offset given back (p_next is at or above the first
-- offset it reserved on the partition, and at or below the head) and no event, of any
-- transaction, is stored at or above p_next: a head never moves below an offset
-- another transaction took, nor below a stored event.
CREATE OR REPLACE FUNCTION streamd.head_give_back(p_stream_name text, p_partition integer, p_next bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE streamd.stream_partitions h SET next_offset = p_next
     WHERE h.stream_name = p_stream_name AND h.partition = p_partition
       AND h.reserved_by = pg_current_xact_id() AND p_next >= h.reserved_from AND p_next <= h.next_offset
       AND NOT EXISTS (SELECT 1 FROM streamd.events e
                        WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" >= p_next);
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('give back offsets of %s/%s from %s: only offsets this transaction reserved and left unused can be given back',
                             p_stream_name, p_partition, p_next);
    END IF;
END;
$$;

-- Locks the head rows of partitions p_partitions of p_stream_name, in ascending
-- partition order (so concurrent appends never deadlock on them), until the calling
-- transaction ends: what append_versioned holds while it checks keys and versions
-- before it reserves.
CREATE OR REPLACE FUNCTION streamd.head_lock(p_stream_name text, p_partitions integer[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM streamd.stream_partitions h
      WHERE h.stream_name = p_stream_name AND h.partition = ANY (p_partitions)
      ORDER BY h.partition FOR NO KEY UPDATE;
END;
$$;

REVOKE EXECUTE ON FUNCTION streamd.head_reserve(text, integer, integer), streamd.head_give_back(text, integer, bigint),
                           streamd.head_lock(text, integer[]) FROM PUBLIC;

-- Roles bound before these functions existed get what bind_tenant_role now grants.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_catalog.pg_roles ro ON ro.rolname = t.role_name LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION streamd.head_reserve(text, integer, integer), streamd.head_give_back(text, integer, bigint),
                        streamd.head_lock(text, integer[]) TO %s', quote_ident(r.role_name));
    END LOOP;
END;
$$;
