-- Reads by correlation id and by event type within a stream (seed 003 indexes events
-- by both; issue 20, point 6), with an opt-in index per stream. Applied idempotently
-- on every migrate.
--
-- The index of a stream is partial: (correlation_id | event_type, partition, "offset")
-- WHERE stream_name = <the stream>. So only the opted-in stream's appends pay for it,
-- and a read is an index range scan in (partition, offset) order. A partial index is
-- used only by a query whose plan knows the stream name, so the reads build their
-- statement with the name as a literal (format %L) and the values as parameters.
-- Without the index a read still answers, by reading every retained event of the
-- stream (its primary-key range).
--
-- Errors: SD001/SD003 for a missing or invalid stream, SD005 for any other bad input.

CREATE OR REPLACE FUNCTION streamd.read_index_check(p_stream text, p_kind text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM streamd.streams s WHERE s.stream_name = p_stream;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream, 0);
    END IF;
    IF p_kind IS NULL OR p_kind NOT IN ('correlation_id', 'event_type') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('read index %L: the kinds are correlation_id and event_type', p_kind);
    END IF;
END;
$$;

-- The name of a stream's read index of p_kind: the stream name does not fit an
-- identifier (249 characters), so a hash of it.
CREATE OR REPLACE FUNCTION streamd.read_index_name(p_stream text, p_kind text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'events_' || CASE p_kind WHEN 'correlation_id' THEN 'corr' ELSE 'type' END || '_' || left(md5(p_stream), 20)
$$;

-- The statement that creates (p_create) or drops the read index of p_kind on p_stream,
-- CONCURRENTLY, so appends go on while it is built: the caller runs it outside a
-- transaction block (streams.Client.EnableReadIndex does).
CREATE OR REPLACE FUNCTION streamd.read_index_ddl(p_stream text, p_kind text, p_create boolean) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM streamd.read_index_check(p_stream, p_kind);
    IF p_create THEN
        RETURN format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON streamd.events (%I, partition, "offset") WHERE stream_name = %L%s',
                      streamd.read_index_name(p_stream, p_kind), p_kind, p_stream,
                      CASE p_kind WHEN 'correlation_id' THEN ' AND correlation_id IS NOT NULL' ELSE '' END);
    END IF;
    RETURN format('DROP INDEX CONCURRENTLY IF EXISTS streamd.%I', streamd.read_index_name(p_stream, p_kind));
END;
$$;

-- The read indexes a stream has, and whether each is ready (a CONCURRENTLY build that
-- failed, cancelled or a deadlock victim, leaves an invalid index, which
-- CREATE INDEX ... IF NOT EXISTS would keep: streams.Client.EnableReadIndex finds it
-- here, drops it and builds it again).
CREATE OR REPLACE FUNCTION streamd.read_indexes(p_stream text)
RETURNS TABLE (kind text, index_name text, valid boolean)
LANGUAGE sql STABLE AS $$
    SELECT k.kind, c.relname::text, i.indisvalid
      FROM unnest(ARRAY['correlation_id', 'event_type']) k(kind)
      JOIN pg_class c ON c.relname = streamd.read_index_name(p_stream, k.kind)
      JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'streamd'
      JOIN pg_index i ON i.indexrelid = c.oid
     ORDER BY k.kind
$$;

-- Up to p_limit retained events of p_stream whose p_kind (correlation_id or
-- event_type) is p_value, after position (p_after_partition, p_after_offset), in
-- (partition, offset) order: page on by passing the last one returned.
CREATE OR REPLACE FUNCTION streamd.read_events_by(
    p_stream text, p_kind text, p_value text, p_after_partition integer, p_after_offset bigint, p_limit integer
) RETURNS TABLE (partition integer, "offset" bigint, event_id text, event_type text, key text, data jsonb,
                 data_bytes bytea, metadata jsonb, "timestamp" timestamptz, correlation_id text,
                 causation_id text, version integer)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM streamd.read_index_check(p_stream, p_kind);
    IF p_value IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('read %s of stream %L: give a value', p_kind, p_stream);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('read %s of stream %L: limit %s must be between 1 and 10000', p_kind, p_stream, p_limit);
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT e.partition, e."offset", e.event_id, e.event_type, e.key, e.data, e.data_bytes, e.metadata,
                e."timestamp", e.correlation_id, e.causation_id, e.version
           FROM streamd.events e
          WHERE e.stream_name = %L AND e.%I = $1 AND (e.partition, e."offset") > ($2, $3)
          ORDER BY e.partition, e."offset"
          LIMIT $4', p_stream, p_kind)
    USING p_value, coalesce(p_after_partition, -1), coalesce(p_after_offset, -1), p_limit;
END;
$$;
