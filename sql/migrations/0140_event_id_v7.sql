-- Event ids that the server makes (a plain INSERT without one, streamd.append given a
-- NULL id) are UUIDv7, as the Go client's are (streams/eventid.go): the first 48 bits
-- are the Unix time in milliseconds, so ids made one after another land at the
-- right-hand edge of the stream's range of the unique (stream_name, event_id) index,
-- as a serial key does, where random UUIDv4s landed on random leaves (more pages
-- touched, and more full-page images in the WAL after each checkpoint; bench/RESULTS.md,
-- issue 21 §2). The other bits are gen_random_uuid()'s, with the version set to 7.
-- PostgreSQL 18 has uuidv7(); 15 to 17 do not. In a migration, not a functions file:
-- the column default below depends on it (sql/doc.go).
CREATE OR REPLACE FUNCTION streamd.new_event_id() RETURNS text
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                                          PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                                          FROM 1 FOR 6),
                                  52, 1), 53, 1), 'hex')::uuid::text
$$;

ALTER TABLE streamd.events ALTER COLUMN event_id SET DEFAULT streamd.new_event_id();
