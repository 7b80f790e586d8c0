package streams_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestProducerHeldKeyFailsAlone: on a stream with per-key versions, a record whose key
// another session holds (SD404) fails alone; the records of other keys in its batch are
// appended. The whole batch used to fail, because SD404 was not taken for one record's
// fault and the batch was not retried record by record.
func TestProducerHeldKeyFailsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("heldalone")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	_, err := pool.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", s)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT streamd.open_key_session($1, 'held', 'sess', '1 minute', NULL)", s)
	require.NoError(t, err)

	prod, err := streams.NewProducer(pool, &streams.ProducerConfig{Linger: 100 * time.Millisecond})
	require.NoError(t, err)
	defer prod.Close(ctx)
	pos, errs := produceOneBatch(t, prod,
		streams.Record{Stream: s, Key: "a", Data: json.RawMessage(`1`)},
		streams.Record{Stream: s, Key: "held", Data: json.RawMessage(`1`)},
		streams.Record{Stream: s, Key: "b", Data: json.RawMessage(`1`)})
	require.NoError(t, errs[0])
	require.Equal(t, sqlerr.SessionHeld, sqlerr.Code(errs[1]), "the held key fails with SD404: %v", errs[1])
	require.NoError(t, errs[2])
	require.Less(t, pos[0].Offset, pos[2].Offset, "the others keep their order")
	var stored []string
	rows, err := pool.Query(ctx, `SELECT key FROM streamd.events WHERE stream_name = $1 ORDER BY "offset"`, s)
	require.NoError(t, err)
	stored, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, stored)
}

// TestProducerOversizedEventIDFailsAlone: a record whose key is too large for an
// index (here a versioned stream's key version index: 54000, program_limit_exceeded)
// fails alone; the others of its batch are appended. The whole batch used to fail with
// it. An event id over MaxIDBytes (it was the 54000 of the event id index) is refused
// before it is sent, alone too.
func TestProducerOversizedEventIDFailsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.Pool().Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", s)
	require.NoError(t, err)
	prod, err := streams.NewProducer(c.Pool(), &streams.ProducerConfig{Linger: 100 * time.Millisecond})
	require.NoError(t, err)
	defer prod.Close(ctx)
	noise := make([]byte, 8000) // random, so that the index cannot compress it
	_, _ = rand.Read(noise)
	_, errs := produceOneBatch(t, prod,
		streams.Record{Stream: s, Key: "a", Data: json.RawMessage(`1`)},
		streams.Record{Stream: s, Key: hex.EncodeToString(noise), Data: json.RawMessage(`1`)},
		streams.Record{Stream: s, Key: "b", Data: json.RawMessage(`1`)},
		streams.Record{Stream: s, Key: "c", EventID: hex.EncodeToString(noise), Data: json.RawMessage(`1`)})
	require.NoError(t, errs[0])
	require.Equal(t, "54000", sqlerr.Code(errs[1]), "the oversized key fails: %v", errs[1])
	require.ErrorIs(t, errs[1], streams.ErrInvalidArgument, "typed, the caller's input")
	require.NoError(t, errs[2])
	require.ErrorIs(t, errs[3], streams.ErrInvalidArgument, "the oversized event id is refused")
}

// TestProducerAsyncEarlyErrorsCallDoneElsewhere: ProduceAsync calls done from another
// goroutine even for errors it finds before enqueuing (bad input, an unknown stream, a
// closed producer), as its doc says, so a caller may hold a lock that done takes. done
// used to be called inside ProduceAsync for those, which deadlocked such a caller.
func TestProducerAsyncEarlyErrorsCallDoneElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	prod, err := streams.NewProducer(c.Pool(), nil)
	require.NoError(t, err)
	closed, err := streams.NewProducer(c.Pool(), nil)
	require.NoError(t, err)
	require.NoError(t, closed.Close(ctx))
	defer prod.Close(ctx)

	for _, tc := range []struct {
		name string
		prod *streams.Producer
		rec  streams.Record
		want error
	}{
		{"invalid", prod, streams.Record{Stream: "no spaces allowed"}, streams.ErrInvalidName},
		{"unknown stream", prod, streams.Record{Stream: testdb.Name("missing")}, streams.ErrStreamNotFound},
		{"closed", closed, streams.Record{Stream: s, Data: json.RawMessage(`1`)}, streams.ErrProducerClosed},
	} {
		var mu sync.Mutex
		got := make(chan error, 1)
		returned := make(chan struct{})
		mu.Lock()
		go func() {
			defer close(returned)
			tc.prod.ProduceAsync(ctx, tc.rec, func(_ streams.Position, err error) {
				mu.Lock() // the caller's lock, held around ProduceAsync
				defer mu.Unlock()
				got <- err
			})
		}()
		select {
		case <-returned:
		case <-time.After(5 * time.Second):
			mu.Unlock() // let the stuck call finish
			t.Fatalf("%s: ProduceAsync called done inside the call and deadlocked on the caller's lock", tc.name)
		}
		mu.Unlock()
		select {
		case err := <-got:
			require.ErrorIs(t, err, tc.want, tc.name)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: done was not called", tc.name)
		}
	}
}

// TestProducerSeesRaisedPayloadLimit: after an operator raises a stream's
// max_payload_bytes, a record above the old limit is appended once the producer's
// metadata is over a second old; it was refused with ErrPayloadTooLarge until
// MetadataMaxAge (30 s) passed.
func TestProducerSeesRaisedPayloadLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	pool := c.Pool()
	_, err := pool.Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = 16 WHERE stream_name = $1", s)
	require.NoError(t, err)
	prod, err := streams.NewProducer(pool, nil)
	require.NoError(t, err)
	defer prod.Close(ctx)
	big := streams.Record{Stream: s, Data: json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)}
	_, err = prod.Produce(ctx, big)
	require.ErrorIs(t, err, streams.ErrPayloadTooLarge)

	_, err = pool.Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = 1024 WHERE stream_name = $1", s)
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond) // the producer re-reads at most once a second
	_, err = prod.Produce(ctx, big)
	require.NoError(t, err)
}

// acquireSignal signals each pool Acquire as it starts.
type acquireSignal struct{ started chan struct{} }

func (a *acquireSignal) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (a *acquireSignal) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (a *acquireSignal) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	select {
	case a.started <- struct{}{}:
	default:
	}
	return ctx
}

func (a *acquireSignal) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
}

// TestProducerMetadataLoadBlocksNoOne: while one Produce waits to load a stream's
// metadata (here: for the pool's only connection), Produce calls to a stream whose
// metadata is cached (fresh or stale) proceed, and calls waiting for the same load
// still return when their ctx ends. They all used to wait on one producer-wide mutex
// held across the load, ignoring their ctx.
func TestProducerMetadataLoadBlocksNoOne(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := testdb.Pool(t)
	c := streams.NewClient(admin, nil)
	cached, stale, uncached := testdb.Name("cached"), testdb.Name("stale"), testdb.Name("uncached")
	for _, s := range []string{cached, stale, uncached} {
		require.NoError(t, c.CreateStream(ctx, s, 1))
	}

	cfg := testdb.Config(t)
	cfg.MaxConns = 1
	sig := &acquireSignal{started: make(chan struct{}, 1)}
	cfg.ConnConfig.Tracer = sig
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	const maxAge = 500 * time.Millisecond
	prod, err := streams.NewProducer(pool, &streams.ProducerConfig{MetadataMaxAge: maxAge})
	require.NoError(t, err)
	defer prod.Close(context.Background())

	_, err = prod.Produce(ctx, streams.Record{Stream: stale, Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	time.Sleep(maxAge + 100*time.Millisecond) // stale's metadata is now past MetadataMaxAge
	_, err = prod.Produce(ctx, streams.Record{Stream: cached, Data: json.RawMessage(`1`)})
	require.NoError(t, err)

	// Hold the pool's one connection for 3 s, and start a load of uncached's metadata:
	// it waits for the connection.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	var release sync.Once
	defer release.Do(conn.Release)
	time.AfterFunc(3*time.Second, func() { release.Do(conn.Release) })
	loaderErrs := make(chan error, 2)
	startLoader := func(s string) {
		for len(sig.started) > 0 {
			<-sig.started
		}
		go func() {
			_, err := prod.Produce(ctx, streams.Record{Stream: s, Data: json.RawMessage(`1`)})
			loaderErrs <- err
		}()
		select {
		case <-sig.started: // the load waits for the connection
		case <-time.After(2 * time.Second):
			t.Fatalf("the load of %s's metadata never asked for a connection", s)
		}
	}
	check := func(s string) {
		t.Helper()
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancelShort()
		start := time.Now()
		_, err := prod.Produce(short, streams.Record{Stream: s, EventID: "short", Data: json.RawMessage(`1`)})
		require.ErrorIs(t, err, context.DeadlineExceeded, s)
		require.Less(t, time.Since(start), 1500*time.Millisecond, "Produce to %s waited for another stream's metadata load", s)
	}
	startLoader(uncached)
	check(cached)   // another stream, fresh metadata
	check(uncached) // waits for the load, but only as long as its ctx
	// stale's metadata is past MetadataMaxAge: one caller reloads it, the others are
	// served the stale copy meanwhile.
	startLoader(stale)
	check(stale)
	release.Do(conn.Release)
	for range 2 {
		require.NoError(t, <-loaderErrs)
	}
	require.NoError(t, prod.Flush(ctx))
	// Served the stale copy, the record to stale was enqueued before its ctx ended,
	// and is appended once the connection is free.
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1 AND event_id = 'short'",
		stale).Scan(&n))
	require.Equal(t, 1, n, "the record to stale was routed with the stale metadata")
}

// TestProducerFlushWaitsForEarlyFailures: a record refused before it was enqueued (an
// unknown stream) has its done called on a goroutine of its own; Flush and Close still
// wait for it, so a caller that reads the outcome after Flush sees it. done used to
// run whenever, after Flush and Close had returned.
func TestProducerFlushWaitsForEarlyFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prod, err := streams.NewProducer(testdb.Pool(t), nil)
	require.NoError(t, err)
	var mu sync.Mutex
	var got error
	for i := range 20 {
		prod.ProduceAsync(ctx, streams.Record{Stream: testdb.Name("no-such"), Data: json.RawMessage(`1`)},
			func(_ streams.Position, err error) {
				if i == 19 {
					time.Sleep(50 * time.Millisecond) // a slow callback
				}
				mu.Lock()
				defer mu.Unlock()
				got = errors.Join(got, err)
			})
	}
	require.NoError(t, prod.Flush(ctx))
	mu.Lock()
	require.Error(t, got, "the early failures' done ran before Flush returned")
	require.Len(t, strings.Split(got.Error(), "\n"), 20)
	mu.Unlock()
	require.NoError(t, prod.Close(ctx))
}
