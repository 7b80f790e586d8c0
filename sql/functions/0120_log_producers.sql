-- The append path of Kafka's Produce (streams.Client.AppendPartition): one batch to
-- one partition, in a transaction of its own that ends right after the caller's COPY.
--
-- With a producer (p_producer_id not NULL), first checks the batch's sequences
-- against the producer's state for the partition, under that state row's lock (held
-- until the transaction ends, so a producer's batches to a partition are checked one
-- at a time):
--   - an epoch below the producer's: SD009 (fenced: a newer instance of the producer
--     took over);
--   - a retry of one of the last 5 batches (same first and last sequence): status
--     'duplicate' with that batch's offset and time; nothing is reserved;
--   - a batch of sequences below the last appended, older than those 5: SD010;
--   - a first sequence that does not follow the last one (0 for a new producer or a
--     new epoch): SD008;
--   - else status 'ok'.
-- Then reserves p_count offsets (L1) as streamd.append_reserve does, records the batch
-- in the producer's state, and returns the first offset, the log time and the
-- stream's value format (for the caller: 'json' stores values as data).
-- p_max_payload_bytes is the largest payload of the batch: over the stream's limit
-- is SD004. A stream with per-key versions or enforced event types takes appends
-- through streamd.append() only: SD005.
CREATE OR REPLACE FUNCTION streamd.append_reserve_producer(p_stream_name text, p_partition integer, p_count integer,
                                                           p_max_payload_bytes integer, p_producer_id bigint,
                                                           p_epoch smallint, p_first_sequence integer)
RETURNS TABLE (status text, base bigint, ts timestamptz, value_format text)
LANGUAGE plpgsql AS $$
DECLARE
    v_stream streamd.streams%ROWTYPE;
    v_state  streamd.producer_partitions%ROWTYPE;
    v_last   integer;
    v_i      integer;
    v_expect integer;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND OR p_partition < 0 OR p_partition >= v_stream.partitions THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    IF p_count < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('append to %s/%s: a batch needs at least one record', p_stream_name, p_partition);
    END IF;
    IF v_stream.key_versions OR v_stream.enforce_event_types THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('stream %L keeps per-key versions or enforces event types: append to it with streamd.append()', p_stream_name);
    END IF;
    IF p_max_payload_bytes > v_stream.max_payload_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'SD004',
            MESSAGE = format('stream %L: a payload of %s bytes is over the limit of %s', p_stream_name, p_max_payload_bytes, v_stream.max_payload_bytes);
    END IF;

    IF p_producer_id IS NOT NULL THEN
        IF p_epoch IS NULL OR p_epoch < 0 OR p_first_sequence IS NULL OR p_first_sequence < 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'SD005',
                MESSAGE = format('append to %s/%s: producer %s needs an epoch and a first sequence >= 0', p_stream_name, p_partition, p_producer_id);
        END IF;
        v_last := (p_first_sequence::bigint + p_count - 1) % 2147483648;  -- sequences wrap at 2^31
        INSERT INTO streamd.producer_partitions AS pp (stream_name, partition, producer_id, epoch, last_sequence,
                                                       batch_first, batch_last, batch_offset, batch_ts)
        VALUES (p_stream_name, p_partition, p_producer_id, p_epoch, -1, '{}', '{}', '{}', '{}')
        ON CONFLICT (stream_name, partition, producer_id) DO NOTHING;
        SELECT * INTO v_state FROM streamd.producer_partitions pp
         WHERE pp.stream_name = p_stream_name AND pp.partition = p_partition AND pp.producer_id = p_producer_id
           FOR UPDATE;
        IF p_epoch < v_state.epoch THEN
            RAISE EXCEPTION USING ERRCODE = 'SD009',
                MESSAGE = format('producer %s epoch %s is fenced on %s/%s: epoch %s took over', p_producer_id, p_epoch, p_stream_name, p_partition, v_state.epoch);
        END IF;
        IF p_epoch > v_state.epoch THEN
            -- A new epoch starts its sequences at 0.
            v_state.last_sequence := -1;
            v_state.batch_first := '{}'; v_state.batch_last := '{}'; v_state.batch_offset := '{}'; v_state.batch_ts := '{}';
        END IF;
        FOR v_i IN 1 .. coalesce(cardinality(v_state.batch_first), 0) LOOP
            IF v_state.batch_first[v_i] = p_first_sequence AND v_state.batch_last[v_i] = v_last THEN
                RETURN QUERY SELECT 'duplicate'::text, v_state.batch_offset[v_i], v_state.batch_ts[v_i], v_stream.value_format;
                RETURN;
            END IF;
        END LOOP;
        v_expect := (v_state.last_sequence::bigint + 1) % 2147483648;
        IF v_state.last_sequence >= 0 AND p_first_sequence < v_expect AND v_last < v_expect THEN
            RAISE EXCEPTION USING ERRCODE = 'SD010',
                MESSAGE = format('producer %s on %s/%s: sequences %s to %s were appended before (and are older than the last 5 batches)',
                                 p_producer_id, p_stream_name, p_partition, p_first_sequence, v_last);
        END IF;
        IF p_first_sequence <> v_expect THEN
            RAISE EXCEPTION USING ERRCODE = 'SD008',
                MESSAGE = format('producer %s on %s/%s: sequence %s is out of order, expected %s', p_producer_id, p_stream_name, p_partition, p_first_sequence, v_expect);
        END IF;
    END IF;

    SELECT hr.base, hr.ts INTO base, ts FROM streamd.head_reserve(p_stream_name, p_partition, p_count) hr;
    IF base IS NULL THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    PERFORM streamd.append_recheck_rules(p_stream_name, v_stream.key_versions, v_stream.enforce_event_types);

    IF p_producer_id IS NOT NULL THEN
        UPDATE streamd.producer_partitions pp
           SET epoch = p_epoch, last_sequence = v_last,
               batch_first  = (v_state.batch_first  || p_first_sequence)[greatest(cardinality(v_state.batch_first) - 3, 1):],
               batch_last   = (v_state.batch_last   || v_last)[greatest(cardinality(v_state.batch_last) - 3, 1):],
               batch_offset = (v_state.batch_offset || base)[greatest(cardinality(v_state.batch_offset) - 3, 1):],
               batch_ts     = (v_state.batch_ts     || ts)[greatest(cardinality(v_state.batch_ts) - 3, 1):],
               updated_at   = ts
         WHERE pp.stream_name = p_stream_name AND pp.partition = p_partition AND pp.producer_id = p_producer_id;
    END IF;
    PERFORM set_config('streamd.append_trusted', 'on', true);
    status := 'ok';
    value_format := v_stream.value_format;
    RETURN NEXT;
END;
$$;

-- Hands out a new producer id (p_producer_id NULL), or the next epoch of an existing
-- one (Kafka's InitProducerId with a known id and epoch: the producer bumps its epoch
-- to recover). Returns the id and the epoch. An id that is not known (any more: its
-- state expired, streamd.expire_producers) gets a new id, as Kafka answers a producer
-- without a transactional id; an epoch that is not the current one is SD009.
CREATE OR REPLACE FUNCTION streamd.init_producer(p_producer_id bigint, p_epoch smallint)
RETURNS TABLE (producer_id bigint, epoch smallint)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_producer_id IS NULL OR p_producer_id < 0
       OR NOT EXISTS (SELECT 1 FROM streamd.producers p WHERE p.producer_id = p_producer_id) THEN
        INSERT INTO streamd.producers AS p (producer_id) VALUES (nextval('streamd.producer_id_seq'))
        RETURNING p.producer_id, p.epoch INTO producer_id, epoch;
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE streamd.producers p
       SET epoch = (p.epoch + 1) % 32767, updated_at = clock_timestamp()
     WHERE p.producer_id = p_producer_id AND p.epoch = p_epoch
    RETURNING p.producer_id, p.epoch INTO producer_id, epoch;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD009',
            MESSAGE = format('producer %s epoch %s is not current: it cannot bump its epoch', p_producer_id, p_epoch);
    END IF;
    RETURN NEXT;
END;
$$;

-- Producer state expiry (Kafka's producer.id.expiration.ms): forgets the partition
-- state of every idempotent producer that appended nothing to that partition for
-- p_idle, and the producers whose every partition state is gone and that took no id
-- or epoch for p_idle. The time is the database's (p_now NULL) or p_now (tests).
-- A producer that comes back after its state went is a new producer to the
-- partition: its next batch must start at sequence 0 (else SD008, which Kafka
-- clients answer by bumping their epoch or taking a new id), and a retry of a batch
-- from before is no longer recognised. Returns how many partition states and
-- producers it deleted.
CREATE OR REPLACE FUNCTION streamd.expire_producers(p_idle interval, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (partition_states bigint, producers bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_before timestamptz := coalesce(p_now, now()) - p_idle;
BEGIN
    IF p_idle IS NULL OR p_idle <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('expire producers: the idle time %s must be positive', p_idle);
    END IF;
    -- Each row is deleted under its lock, so a batch checked against a state (which
    -- holds that lock) is never cut short; a batch that comes after the delete finds
    -- no state and starts a new one.
    DELETE FROM streamd.producer_partitions pp WHERE pp.updated_at < v_before;
    GET DIAGNOSTICS partition_states = ROW_COUNT;
    DELETE FROM streamd.producers p
     WHERE p.updated_at < v_before
       AND NOT EXISTS (SELECT 1 FROM streamd.producer_partitions pp WHERE pp.producer_id = p.producer_id);
    GET DIAGNOSTICS producers = ROW_COUNT;
    RETURN NEXT;
END;
$$;
