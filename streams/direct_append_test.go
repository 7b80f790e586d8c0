package streams_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestDirectAppendDeclinesWritingNothing: the one-statement path's statement (one
// record, and a batch of three) returns no row and writes nothing, no event and no
// offset, for each batch it must not append (an unknown stream, a partition the
// stream lacks, a payload over the limit, JSON or binary, a read-only stream, a
// stream with per-key versions); Produce then answers the typed error of
// streamd.append() (or appends on the event sourcing path), and still nothing was
// written. A retry of stored event ids is answered Duplicate at the original
// positions, no offset taken.
func TestDirectAppendDeclinesWritingNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 2)
	pool := c.Pool()
	_, err := pool.Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = 64 WHERE stream_name = $1", s)
	require.NoError(t, err)
	ro := testdb.Name("ro")
	require.NoError(t, c.CreateStream(ctx, ro, 1))
	_, err = pool.Exec(ctx, "UPDATE streamd.streams SET read_only = true WHERE stream_name = $1", ro)
	require.NoError(t, err)
	kv := testdb.Name("kv")
	require.NoError(t, c.CreateStream(ctx, kv, 1))
	_, err = pool.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", kv)
	require.NoError(t, err)

	// What is stored: the events and heads of the three streams.
	state := func() string {
		var out string
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(string_agg(x, ' ' ORDER BY x), '') FROM (
			SELECT format('%s/%s@%s', stream_name, partition, next_offset) AS x FROM streamd.stream_partitions
			 WHERE stream_name IN ($1, $2, $3)
			UNION ALL
			SELECT format('%s/%s:%s', stream_name, partition, "offset") FROM streamd.events
			 WHERE stream_name IN ($1, $2, $3)) v`, s, ro, kv).Scan(&out))
		return out
	}
	first := []streams.Record{{Stream: s, Partition: streams.PartitionOf(0), EventID: "stored-0", Data: json.RawMessage(`{}`)},
		{Stream: s, Partition: streams.PartitionOf(0), EventID: "stored-1", Data: json.RawMessage(`{}`)}}
	stored, err := c.Produce(ctx, first...)
	require.NoError(t, err)

	batch := func(n int, stream string, partition int32, mod func(*streams.Record)) []streams.Record {
		recs := make([]streams.Record, n)
		for i := range recs {
			recs[i] = streams.Record{Stream: stream, Partition: streams.PartitionOf(partition),
				EventID: fmt.Sprintf("%s-%d-%d-%d", stream, partition, n, i), Key: "k", Data: json.RawMessage(`{"a":1}`)}
		}
		mod(&recs[n-1])
		return recs
	}
	same := func(*streams.Record) {}
	for _, n := range []int{1, 3} {
		for _, tc := range []struct {
			name      string
			stream    string
			partition int32
			mod       func(*streams.Record)
			want      error // nil: appended by streamd.append()
		}{
			{"unknown stream", "no-such-" + s, 0, same, streams.ErrStreamNotFound},
			{"partition the stream lacks", s, 2, same, streams.ErrPartitionNotFound},
			{"JSON payload over the limit", s, 1, func(r *streams.Record) {
				r.Data = json.RawMessage(`"` + strings.Repeat("x", 64) + `"`)
			}, streams.ErrPayloadTooLarge},
			{"binary payload over the limit", s, 1, func(r *streams.Record) { r.Data, r.Bytes = nil, make([]byte, 65) }, streams.ErrPayloadTooLarge},
			{"read-only stream", ro, 0, same, streams.ErrInvalidArgument},
			{"per-key versions", kv, 0, same, nil},
		} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, n), func(t *testing.T) {
				recs := batch(n, tc.stream, tc.partition, tc.mod)
				before := state()
				q, args, err := streams.InsertStatement(tc.stream, tc.partition, recs)
				require.NoError(t, err)
				rows, err := pool.Query(ctx, q, args...)
				require.NoError(t, err)
				declined := !rows.Next()
				rows.Close()
				require.NoError(t, rows.Err())
				require.True(t, declined, "the statement declines")
				require.Equal(t, before, state(), "the statement wrote nothing")

				pos, err := c.Produce(ctx, recs...)
				if tc.want != nil {
					require.ErrorIs(t, err, tc.want)
					require.Equal(t, before, state(), "nothing was written")
					return
				}
				require.NoError(t, err)
				require.Len(t, pos, n)
			})
		}
	}

	before := state()
	again, err := c.Produce(ctx, first...)
	require.NoError(t, err)
	for i := range again {
		require.True(t, again[i].Duplicate)
		require.Equal(t, stored[i].Offset, again[i].Offset)
	}
	require.Equal(t, before, state(), "a retry took no offset")
}

// TestDirectAppendsStayGaplessWithALiveReader (L1, L2): Produce calls of one and of
// a few records to explicit partitions (the one-statement path, alone and in shared
// transactions), from eight goroutines, with plain SQL INSERTs to the same
// partitions in between, while a live reader per partition reads "offset >= next":
// no reader sees a gap, a duplicate or an offset out of order, and every
// acknowledged record is read at its acknowledged position.
func TestDirectAppendsStayGaplessWithALiveReader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const partitions = 2
	c, s := setup(t, partitions)
	pool := c.Pool()
	shared := streams.NewClient(pool, &streams.ClientConfig{MaxAppendsInFlight: 1})
	var (
		mu    sync.Mutex
		acked = map[string]streams.Position{}
	)
	writers, wctx := errgroup.WithContext(ctx)
	for w := 0; w < 8; w++ {
		client := c
		if w%2 == 1 {
			client = shared
		}
		writers.Go(func() error {
			for i := 0; i < 40; i++ {
				n := 1 + i%3*2 // 1, 3, 5
				recs := make([]streams.Record, n)
				for j := range recs {
					recs[j] = streams.Record{Stream: s, Partition: streams.PartitionOf(int32((w + i) % partitions)),
						EventID: fmt.Sprintf("w%d-%d-%d", w, i, j), Data: json.RawMessage(`{"w":1}`)}
				}
				pos, err := client.Produce(wctx, recs...)
				if err != nil {
					return err
				}
				mu.Lock()
				for j := range recs {
					acked[recs[j].EventID] = pos[j]
				}
				mu.Unlock()
			}
			return nil
		})
	}
	writers.Go(func() error {
		for i := 0; i < 40; i++ {
			id := fmt.Sprintf("sql-%d", i)
			var p streams.Position
			err := pool.QueryRow(wctx, `INSERT INTO streamd.events (stream_name, partition, event_id, data, "offset")
				VALUES ($1, $2, $3, '{}', 999999) RETURNING partition, "offset"`, s, i%partitions, id).Scan(&p.Partition, &p.Offset)
			if err != nil {
				return err
			}
			mu.Lock()
			acked[id] = p
			mu.Unlock()
		}
		return nil
	})
	const total = 8*(14*1+13*3+13*5) + 40
	done := make(chan error, 1)
	go func() { done <- writers.Wait() }()

	read := map[string]streams.Position{}
	var readMu sync.Mutex
	readers, rctx := errgroup.WithContext(ctx)
	for p := int32(0); p < partitions; p++ {
		readers.Go(func() error {
			next := int64(0)
			for {
				readMu.Lock()
				n := len(read)
				readMu.Unlock()
				if n == total {
					return nil
				}
				res, err := c.Fetch(rctx, s, p, next, &streams.FetchOpts{MaxWait: 50 * time.Millisecond})
				if err != nil {
					return err
				}
				for _, e := range res.Events {
					if e.Offset != next {
						return fmt.Errorf("partition %d: read offset %d where %d was next", p, e.Offset, next)
					}
					next++
					readMu.Lock()
					if _, dup := read[e.EventID]; dup {
						readMu.Unlock()
						return fmt.Errorf("event %s read twice", e.EventID)
					}
					read[e.EventID] = streams.Position{Partition: p, Offset: e.Offset}
					readMu.Unlock()
				}
			}
		})
	}
	require.NoError(t, <-done)
	require.NoError(t, readers.Wait())
	require.Len(t, acked, total)
	for id, p := range acked {
		got, ok := read[id]
		require.True(t, ok, "acknowledged %s was read", id)
		require.Equal(t, p.Partition, got.Partition, id)
		require.Equal(t, p.Offset, got.Offset, id)
	}
}

// TestDirectAppendRacingASettingsChangeIsRetried: a one-record Produce (the
// one-statement path) that read its stream's settings and then waited for the head
// row while set_stream_event_sourcing turned key versions on fails with a retriable
// serialization failure (40001), storing nothing, instead of appending a keyed event
// without a version: the statement's own reads use its snapshot from before the wait,
// so the re-check after the lock is a function's. The retry is versioned.
func TestDirectAppendRacingASettingsChangeIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	pool := c.Pool()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", s)
	require.NoError(t, err)
	rec := streams.Record{Stream: s, Partition: streams.PartitionOf(0), Key: "k", EventID: "e", Data: json.RawMessage(`1`)}
	appended := make(chan error, 1)
	go func() { _, err := c.Produce(ctx, rec); appended <- err }()
	testdb.WaitForLockWait(t, pool, tx, "head_reserve($1, $2, 1)")
	require.NoError(t, tx.Commit(ctx))
	err = <-appended
	require.Equal(t, "40001", sqlerr.Code(err), "%v", err)
	require.True(t, sqlerr.Retriable(err))
	requireCount(t, c, s, 0)

	pos, err := c.Produce(ctx, rec) // the retry
	require.NoError(t, err)
	require.False(t, pos[0].Duplicate)
	var kv *int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT key_version FROM streamd.events WHERE stream_name = $1", s).Scan(&kv))
	require.NotNil(t, kv, "the retry's event is versioned")
	require.EqualValues(t, 1, *kv)
}
