package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
	"github.com/streamd/streamd/streams"
)

// BenchmarkAppendPath measures what issue 9 costs appends, on one connection:
//
//	default/*         a plain stream: the path every stream takes by default;
//	baseline/*        the same in a database where the issue-9 extras that touch every
//	                  stream (tenant_id default, partial key-version index, row-level
//	                  security) are removed: the difference is their cost;
//	key-versions/*    a stream with key versions (append_versioned, key_heads upsert);
//	eventstore-append one event with an expected version (Store.Append).
//
// Run: go test -run '^$' -bench AppendPath -benchtime 3s ./eventstore/
func BenchmarkAppendPath(b *testing.B) {
	ctx := context.Background()
	cfg := testdb.Config(b)
	cfg.MaxConns = 2
	open := func(url string) *pgxpool.Pool {
		c, err := pgxpool.ParseConfig(url)
		require.NoError(b, err)
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		p, err := pgxpool.NewWithConfig(ctx, c)
		require.NoError(b, err)
		b.Cleanup(p.Close)
		return p
	}
	pool := open(cfg.ConnString())
	basePool := open(testdb.FreshDatabase(b))
	_, err := schema.Migrate(ctx, basePool)
	require.NoError(b, err)
	_, err = basePool.Exec(ctx, `ALTER TABLE streamd.events ALTER COLUMN tenant_id DROP DEFAULT;
		DROP INDEX streamd.events_stream_key_version;
		ALTER TABLE streamd.events DISABLE ROW LEVEL SECURITY`)
	require.NoError(b, err)

	mkStream := func(p *pgxpool.Pool, versioned bool) string {
		name := testdb.Name("bench")
		require.NoError(b, streams.NewClient(p, nil).CreateStream(ctx, name, 4))
		if versioned {
			_, err := p.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", name)
			require.NoError(b, err)
		}
		return name
	}
	batch := func(stream string, n, i int) []streams.Record {
		recs := make([]streams.Record, n)
		for j := range recs {
			recs[j] = streams.Record{Stream: stream, Key: strconv.Itoa((i*n + j) % 1000), EventType: "Bench",
				Data: json.RawMessage(`{"amount":42,"note":"a hundred bytes or so of payload to append to the log, as in bench"}`)}
		}
		return recs
	}
	for _, n := range []int{1, 100} {
		for _, c := range []struct {
			name      string
			pool      *pgxpool.Pool
			versioned bool
		}{{"baseline", basePool, false}, {"default", pool, false}, {"key-versions", pool, true}} {
			b.Run(fmt.Sprintf("%s/batch-%d", c.name, n), func(b *testing.B) {
				stream := mkStream(c.pool, c.versioned)
				client := streams.NewClient(c.pool, nil)
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if _, err := client.Produce(ctx, batch(stream, n, i)...); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/event")
			})
		}
	}
	b.Run("eventstore-append", func(b *testing.B) {
		stream := mkStream(pool, true)
		store, err := eventstore.New(pool, nil)
		require.NoError(b, err)
		versions := map[string]int64{}
		for i := 0; b.Loop(); i++ {
			key := strconv.Itoa(i % 1000)
			r, err := store.Append(ctx, stream, key, eventstore.ExactVersion(versions[key]), eventstore.Event{EventType: "Bench", Data: json.RawMessage(`{"amount":42}`)})
			if err != nil {
				b.Fatal(err)
			}
			versions[key] = r.Version
		}
	})
}
