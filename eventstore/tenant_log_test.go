package eventstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestTenantAppendRefusesOtherTenantsEventID: event ids are unique per stream across
// the tenants that share it. A tenant's append of an event id that another tenant's
// event holds is refused with ErrInvalidArgument, naming the id, and stores nothing of
// the batch, through streamd.append and through the producer; the event was dropped
// without a position and the producer failed with an untyped count mismatch after the
// rest of the batch had committed. A tenant's own retry is still a duplicate.
func TestTenantAppendRefusesOtherTenantsEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stream := testdb.Name("tenant-ids")
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, 2)", stream)
	require.NoError(t, err)
	acme := tenantRole(t, admin, "acme-"+stream)
	globex := tenantRole(t, admin, "globex-"+stream)
	_, err = acme.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['ev-1','ev-2'], NULL, ARRAY['k','k'], ARRAY['1','2'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.NoError(t, err)
	count := func() int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", stream).Scan(&n))
		return n
	}

	// streamd.append
	_, err = globex.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['ev-3','ev-1'], NULL, ARRAY['k','k'], ARRAY['9','9'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.Equal(t, "SD005", pgCode(err), "%v", err)
	require.ErrorContains(t, err, "ev-1")
	require.Equal(t, 2, count(), "nothing of globex's batch is stored")
	// A plain INSERT fails on the unique index (docs/tenants.md).
	_, err = globex.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, event_id, data) VALUES ($1, 0, 'ev-1', '9')`, stream)
	require.Equal(t, "23505", pgCode(err), "%v", err)

	// The producer
	pool, err := pgxpool.New(ctx, globex.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()
	client := streams.NewClient(pool, nil)
	p0 := streams.PartitionOf(0)
	_, err = client.Produce(ctx,
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-3", Data: []byte(`9`)},
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-2", Data: []byte(`9`)})
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	require.ErrorContains(t, err, "ev-2")
	require.Equal(t, 2, count(), "nothing of globex's batch is stored")

	// globex's own event ids still deduplicate.
	first, err := client.Produce(ctx, streams.Record{Stream: stream, Partition: p0, EventID: "ev-3", Data: []byte(`9`)})
	require.NoError(t, err)
	again, err := client.Produce(ctx,
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-3", Data: []byte(`9`)},
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-4", Data: []byte(`9`)})
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, first[0].Offset, again[0].Offset)
	require.False(t, again[1].Duplicate)
	require.Equal(t, 4, count())
}
