package streams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

type ackedPos struct {
	partition int32
	offset    int64
}

// TestL1UnderFire appends through the Go producer and through raw SQL INSERT
// transactions that sleep before committing (so commit order and statement order
// differ), while one live reader per partition reads "offset >= next" in order. No
// reader may ever see a gap, a duplicate or an offset out of order, and every
// acknowledged record must be read back at its acknowledged position.
func TestL1UnderFire(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const partitions = 4
	c, s := setup(t, partitions)
	pool := c.Pool()
	prod, err := streams.NewProducer(pool, &streams.ProducerConfig{MaxInFlight: 4})
	require.NoError(t, err)
	defer prod.Close(context.Background())

	var (
		mu    sync.Mutex
		acked = map[string]ackedPos{}
	)
	ack := func(id string, p ackedPos) {
		mu.Lock()
		defer mu.Unlock()
		_, dup := acked[id]
		require.False(t, dup, "event %s acknowledged twice", id)
		acked[id] = p
	}

	writers, wctx := errgroup.WithContext(ctx)
	// Go producer writers: keyed and keyless, concurrent so batches form.
	for w := 0; w < 4; w++ {
		writers.Go(func() error {
			for i := 0; i < 150; i++ {
				id := fmt.Sprintf("go-%d-%d", w, i)
				rec := streams.Record{Stream: s, EventID: id, Data: json.RawMessage(`{"w":1}`)}
				if i%2 == 0 {
					rec.Key = fmt.Sprintf("k%d", i%7)
				}
				pos, err := prod.Produce(wctx, rec)
				if err != nil {
					return err
				}
				ack(id, ackedPos{pos.Partition, pos.Offset})
			}
			return nil
		})
	}
	// A bulk writer: ProduceAsync without waiting, so batches grow large enough for the
	// producer's COPY path, racing the others on the same head rows.
	copiesBefore := streams.CopyAppends() + streams.InsertAppends()
	const bulk = 3000
	writers.Go(func() error {
		errs := make(chan error, bulk)
		for i := 0; i < bulk; i++ {
			id := fmt.Sprintf("bulk-%d", i)
			prod.ProduceAsync(wctx, streams.Record{Stream: s, EventID: id, Key: fmt.Sprintf("b%d", i%11), Data: json.RawMessage(`{"bulk":1}`)},
				func(pos streams.Position, err error) {
					if err == nil {
						ack(id, ackedPos{pos.Partition, pos.Offset})
					}
					errs <- err
				})
		}
		for i := 0; i < bulk; i++ {
			if err := <-errs; err != nil {
				return err
			}
		}
		return nil
	})
	// Raw SQL writers: plain INSERTs in transactions that sleep before committing.
	for w := 0; w < 3; w++ {
		writers.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < 40; i++ {
				var (
					ids []string
					got []ackedPos
				)
				err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
					n := 1 + rng.IntN(3)
					for j := 0; j < n; j++ {
						id := fmt.Sprintf("sql-%d-%d-%d", w, i, j)
						var p ackedPos
						var partition any
						if rng.IntN(2) == 0 {
							partition = rng.IntN(partitions)
						}
						// The offset named here is garbage on purpose: it must be ignored.
						err := tx.QueryRow(wctx, `INSERT INTO streamd.events (stream_name, event_id, event_type, data, partition, key, "offset")
							VALUES ($1, $2, 'sql', '{"sql":true}', $3, $4, 999999) RETURNING partition, "offset"`,
							s, id, partition, fmt.Sprintf("sk%d", rng.IntN(5))).Scan(&p.partition, &p.offset)
						if err != nil {
							return err
						}
						ids = append(ids, id)
						got = append(got, p)
					}
					_, err := tx.Exec(wctx, "SELECT pg_sleep($1)", float64(rng.IntN(15))/1000)
					return err
				})
				if sqlerr.Code(err) == "40P01" {
					// Two plain-SQL transactions locked head rows in opposite orders;
					// PostgreSQL aborted this one. Applications retry, and so do we.
					i--
					continue
				}
				if err != nil {
					return err
				}
				for j, id := range ids {
					ack(id, got[j])
				}
			}
			return nil
		})
	}
	writersDone := make(chan struct{})
	var writersErr error
	go func() { writersErr = writers.Wait(); close(writersDone) }()

	// Live readers: each reads its partition in order while the writers run.
	seen := make([]map[string]int64, partitions)
	readers, rctx := errgroup.WithContext(ctx)
	for p := int32(0); p < partitions; p++ {
		seen[p] = map[string]int64{}
		readers.Go(func() error {
			next := int64(0)
			for {
				finished := false
				select {
				case <-writersDone:
					finished = true
				default:
				}
				res, err := c.Fetch(rctx, s, p, next, &streams.FetchOpts{MaxRecords: 37, MaxWait: 20 * time.Millisecond})
				if err != nil {
					return err
				}
				for _, e := range res.Events {
					if e.Offset != next {
						return fmt.Errorf("partition %d: expected offset %d, read %d (gap or reorder)", p, next, e.Offset)
					}
					if _, dup := seen[p][e.EventID]; dup {
						return fmt.Errorf("partition %d: event %s read twice", p, e.EventID)
					}
					seen[p][e.EventID] = e.Offset
					next++
				}
				if finished && len(res.Events) == 0 && next == res.HighWatermark {
					return nil
				}
			}
		})
	}
	require.NoError(t, readers.Wait())
	require.NoError(t, writersErr)

	require.Len(t, acked, 4*150+bulk+sumSQL(t, pool, s))
	require.Greater(t, streams.CopyAppends()+streams.InsertAppends(), copiesBefore, "the bulk writer's batches took a fast path (one statement or COPY)")
	for id, p := range acked {
		off, ok := seen[p.partition][id]
		require.True(t, ok, "acknowledged event %s (partition %d offset %d) never read", id, p.partition, p.offset)
		require.Equal(t, p.offset, off, "event %s read at another offset than acknowledged", id)
	}
}

func sumSQL(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, s string) int {
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM streamd.events WHERE stream_name = $1 AND event_type = 'sql'", s).Scan(&n))
	return n
}

// TestAppendAtomic: a batch with one bad record writes nothing (L2), and a
// ProduceTx whose transaction rolls back leaves nothing visible and no hole.
func TestAppendAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 2)
	_, err := c.Produce(ctx,
		streams.Record{Stream: s, Data: json.RawMessage(`{"ok":1}`)},
		streams.Record{Stream: s, Partition: streams.PartitionOf(5), Data: json.RawMessage(`{"ok":2}`)})
	require.ErrorIs(t, err, streams.ErrPartitionNotFound)
	requireCount(t, c, s, 0)

	tx, err := c.Pool().Begin(ctx)
	require.NoError(t, err)
	pos, err := streams.ProduceTx(ctx, tx, streams.Record{Stream: s, Partition: streams.PartitionOf(0), Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.Equal(t, int64(0), pos[0].Offset)
	require.NoError(t, tx.Rollback(ctx))
	requireCount(t, c, s, 0)

	// The rolled-back offset is reused: no hole.
	pos, err = c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(0), Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.Equal(t, int64(0), pos[0].Offset)

	// A batch that fails on the server (duplicate key violation inside the caller's
	// transaction after our append) rolls back our append with it.
	err = pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		if _, err := streams.ProduceTx(ctx, tx, streams.Record{Stream: s, Data: json.RawMessage(`2`)}); err != nil {
			return err
		}
		return errors.New("handler failed after appending")
	})
	require.Error(t, err)
	requireCount(t, c, s, 1)
}

func requireCount(t *testing.T, c *streams.Client, s string, want int) {
	t.Helper()
	var n int
	require.NoError(t, c.Pool().QueryRow(context.Background(),
		"SELECT count(*) FROM streamd.events WHERE stream_name = $1", s).Scan(&n))
	require.Equal(t, want, n)
}

// TestRetriedEventIDsThroughProducerAndSQL: L4 on both paths, and the plain INSERT
// path skips a duplicate without leaving a hole.
func TestRetriedEventIDsThroughProducerAndSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	prod, err := streams.NewProducer(c.Pool(), nil)
	require.NoError(t, err)
	defer prod.Close(ctx)
	p1, err := prod.Produce(ctx, streams.Record{Stream: s, EventID: "same", Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	p2, err := prod.Produce(ctx, streams.Record{Stream: s, EventID: "same", Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.True(t, p2.Duplicate)
	require.Equal(t, p1.Offset, p2.Offset)

	tag, err := c.Pool().Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'same', '1')`, s)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a duplicate plain INSERT stores nothing")
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'other', '1')`, s)
	require.NoError(t, err)
	requireCount(t, c, s, 2)
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(2), info.PartitionInfo[0].NextOffset, "no hole after the skipped duplicate")
}

// TestSQLAndGoRouteKeysAlike: a key lands on the same partition by either path.
func TestSQLAndGoRouteKeysAlike(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 7)
	for i := 0; i < 200; i++ {
		key := fmt.Sprintf("key-%d-é", i)
		var sqlPart int32
		require.NoError(t, c.Pool().QueryRow(ctx,
			`INSERT INTO streamd.events (stream_name, key, data) VALUES ($1, $2, '{}') RETURNING partition`, s, key).Scan(&sqlPart))
		require.Equal(t, streams.PartitionForKey(key, 7), sqlPart, "key %q", key)
	}
}

// TestDuplicateInsertWaitingForTheHeadRowLeavesNoHole (L1, L4): a plain INSERT of an
// event id that another transaction is inserting waits for the head row; when the
// other commits, the waiting one is skipped as a duplicate and gives its offset back,
// so the next event takes the next offset. It used to keep the offset, a hole forever.
func TestDuplicateInsertWaitingForTheHeadRowLeavesNoHole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	for name, onConflict := range map[string]string{"plain": "", "on conflict do nothing": " ON CONFLICT DO NOTHING"} {
		t.Run(name, func(t *testing.T) {
			s := testdb.Name("duphole")
			require.NoError(t, c.CreateStream(ctx, s, 1))
			ins := `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, $2, '1')` + onConflict
			tx1, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx1.Rollback(ctx) }()
			_, err = tx1.Exec(ctx, ins, s, "X")
			require.NoError(t, err)
			second := make(chan error, 1)
			go func() {
				tag, err := pool.Exec(ctx, ins+" -- the waiter", s, "X")
				if err == nil && tag.RowsAffected() != 0 {
					err = fmt.Errorf("the duplicate stored %d rows", tag.RowsAffected())
				}
				second <- err
			}()
			testdb.WaitForLockWait(t, pool, tx1, "-- the waiter")
			require.NoError(t, tx1.Commit(ctx))
			require.NoError(t, <-second)
			_, err = pool.Exec(ctx, ins, s, "Y")
			require.NoError(t, err)

			res, err := c.Fetch(ctx, s, 0, 0, nil)
			require.NoError(t, err)
			var offsets []int64
			for _, e := range res.Events {
				offsets = append(offsets, e.Offset)
			}
			require.Equal(t, []int64{0, 1}, offsets, "offsets are gapless")
			require.Equal(t, int64(2), res.HighWatermark)
		})
	}
}
