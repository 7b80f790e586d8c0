package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/projection"
	"github.com/streamd/streamd/streams"
)

func count(state json.RawMessage, e *streams.Event) (json.RawMessage, error) {
	var n struct{ N int }
	if state != nil {
		if err := json.Unmarshal(state, &n); err != nil {
			return nil, err
		}
	}
	n.N++
	return json.Marshal(n)
}

// ApplyTx stores the state with the applied event, and an event at or below the last
// applied one of the same partition (a redelivery) changes nothing; a rolled-back
// transaction leaves nothing; bad input is refused and writes nothing.
func TestApplyTxIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	store := projection.NewStore(pool)
	typ := testdb.Name("counter")
	ev := func(p int32, off int64) *streams.Event {
		return &streams.Event{Stream: "s", Partition: p, Offset: off, EventID: fmt.Sprint("e", p, "-", off)}
	}
	apply := func(e *streams.Event) bool {
		t.Helper()
		var applied bool
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			applied, err = store.ApplyTx(ctx, tx, typ, "agg-1", e, count)
			return err
		}))
		return applied
	}
	require.True(t, apply(ev(0, 5)))
	require.True(t, apply(ev(0, 6)))
	require.False(t, apply(ev(0, 6)), "the same event again")
	require.False(t, apply(ev(0, 2)), "an earlier event of the partition")
	st, err := store.Get(ctx, typ, "agg-1")
	require.NoError(t, err)
	require.JSONEq(t, `{"N": 2}`, string(st.State))
	require.Equal(t, "e0-6", st.LastEventID)
	require.EqualValues(t, 6, st.LastOffset)

	// Rolled back: nothing.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	applied, err := store.ApplyTx(ctx, tx, typ, "agg-1", ev(0, 7), count)
	require.NoError(t, err)
	require.True(t, applied)
	require.NoError(t, tx.Rollback(ctx))
	st, err = store.Get(ctx, typ, "agg-1")
	require.NoError(t, err)
	require.JSONEq(t, `{"N": 2}`, string(st.State))

	_, err = store.Get(ctx, typ, "nobody")
	require.ErrorIs(t, err, projection.ErrNotFound)

	// Bad input.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = store.ApplyTx(ctx, tx, "", "agg-1", ev(0, 8), count)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	_, err = store.ApplyTx(ctx, tx, typ, "", ev(0, 8), count)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	_, err = store.ApplyTx(ctx, tx, typ, "agg-2", nil, count)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	_, err = store.ApplyTx(ctx, tx, typ, "agg-2", ev(0, 8), func(json.RawMessage, *streams.Event) (json.RawMessage, error) {
		return json.RawMessage(`{`), nil
	})
	require.ErrorIs(t, err, streams.ErrInvalidJSON)
	_, err = store.ApplyTx(ctx, tx, typ, "agg-2", ev(0, -1), count)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	require.NoError(t, tx.Rollback(ctx))
	states, err := store.List(ctx, typ)
	require.NoError(t, err)
	require.Len(t, states, 1)
}
