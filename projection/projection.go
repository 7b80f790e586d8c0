// Package projection keeps read models (seed 001's projections): a state per
// (projection type, aggregate id) in streamd.projections, stored with the last event
// applied to it, so that applying an event twice changes nothing.
//
// Store.ApplyTx runs in the caller's transaction. In a consumer group handler with
// consumergroup.CommitTransactional, apply the batch's events and call
// Batch.CommitTx in that same transaction: the states and the group's offset then
// commit together, and a batch delivered again (after a crash, a lost commit
// acknowledgement or an offset reset) applies nothing twice (examples/projection).
package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// ErrNotFound: Get found no state for the projection type and aggregate.
var ErrNotFound = errors.New("projection not found")

// State is a projection's stored state and the last event applied to it.
type State struct {
	Type        string          `json:"projection_type"`
	AggregateID string          `json:"aggregate_id"`
	State       json.RawMessage `json:"state"`
	// LastEventID, LastEventTimestamp, Stream, Partition and LastOffset name the last
	// event applied.
	LastEventID        string    `json:"last_event_id"`
	LastEventTimestamp time.Time `json:"last_event_timestamp"`
	Stream             string    `json:"stream"`
	Partition          int32     `json:"partition"`
	LastOffset         int64     `json:"last_offset"`
	UpdatedAt          time.Time `json:"updated_at"`
}

// Applied reports whether the state already reflects e: e is the last applied event
// or an earlier one of the same stream partition. Events of one aggregate share a
// key, hence a partition, and arrive in offset order; after the stream's partition
// count grew, an aggregate's events may come from another partition, whose offsets
// are not comparable, and are applied.
func (s *State) Applied(e *streams.Event) bool {
	return s.Stream == e.Stream && s.Partition == e.Partition && s.LastOffset >= e.Offset
}

// Store reads and writes projections. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	now  func() time.Time
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool, now: time.Now} }

// ApplyFunc computes a projection's next state from its current one (nil when the
// projection has none yet) and the event. Its error aborts ApplyTx, which returns it.
type ApplyFunc func(state json.RawMessage, e *streams.Event) (json.RawMessage, error)

const selectState = `SELECT projection_type, aggregate_id, state, last_event_id, last_event_timestamp,
       stream_name, partition, last_offset, updated_at
  FROM streamd.projections`

// ApplyTx applies e to the state of projection typ for aggregateID, in tx: it locks
// the state's row, and unless the state already reflects e (State.Applied), stores
// fn's result with e as the last applied event. It returns whether it applied e.
// Concurrent ApplyTx calls on one aggregate serialise on its row (the second waits
// for the first's transaction and then sees its state). Errors:
// streams.ErrInvalidArgument (empty type or aggregate id, nil event or fn),
// streams.ErrInvalidJSON (fn returned something that is not JSON), fn's error; tx
// should then be rolled back.
func (s *Store) ApplyTx(ctx context.Context, tx pgx.Tx, typ, aggregateID string, e *streams.Event, fn ApplyFunc) (bool, error) {
	switch {
	case typ == "" || aggregateID == "":
		return false, fmt.Errorf("apply to projection %q/%q: %w: type and aggregate id must not be empty", typ, aggregateID, streams.ErrInvalidArgument)
	case e == nil || fn == nil:
		return false, fmt.Errorf("apply to projection %s/%s: %w: an event and an ApplyFunc are required", typ, aggregateID, streams.ErrInvalidArgument)
	}
	// A first state of an aggregate may meet a concurrent first state: the insert then
	// stores nothing, and the next round reads and locks the other's row.
	for round := 0; round < 3; round++ {
		cur, err := get(ctx, tx, typ, aggregateID, true)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return false, fmt.Errorf("apply %s/%d@%d to projection %s/%s: %w", e.Stream, e.Partition, e.Offset, typ, aggregateID, err)
		}
		var prev json.RawMessage
		if cur != nil {
			if cur.Applied(e) {
				return false, nil
			}
			prev = cur.State
		}
		next, err := fn(prev, e)
		if err != nil {
			return false, err
		}
		if !json.Valid(next) {
			return false, fmt.Errorf("apply %s/%d@%d to projection %s/%s: %w: the new state is not JSON", e.Stream, e.Partition, e.Offset, typ, aggregateID, streams.ErrInvalidJSON)
		}
		var done bool
		ts := pgtype.Timestamptz{Time: e.Timestamp, Valid: !e.Timestamp.IsZero()}
		if err := tx.QueryRow(ctx, "SELECT streamd.projection_store($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
			typ, aggregateID, string(next), e.EventID, ts, e.Stream, e.Partition, e.Offset, cur != nil, s.now()).Scan(&done); err != nil {
			return false, fmt.Errorf("apply %s/%d@%d to projection %s/%s: %w", e.Stream, e.Partition, e.Offset, typ, aggregateID, sqlerr.Wrap(err))
		}
		if done || cur != nil {
			return done, nil
		}
	}
	return false, fmt.Errorf("apply %s/%d@%d to projection %s/%s: the first state raced with others three times", e.Stream, e.Partition, e.Offset, typ, aggregateID)
}

// Get returns the state of projection typ for aggregateID; ErrNotFound when there is
// none.
func (s *Store) Get(ctx context.Context, typ, aggregateID string) (*State, error) {
	st, err := get(ctx, s.pool, typ, aggregateID, false)
	if err != nil {
		return nil, fmt.Errorf("get projection %s/%s: %w", typ, aggregateID, err)
	}
	return st, nil
}

// GetTx is Get in the caller's transaction.
func (s *Store) GetTx(ctx context.Context, tx pgx.Tx, typ, aggregateID string) (*State, error) {
	st, err := get(ctx, tx, typ, aggregateID, false)
	if err != nil {
		return nil, fmt.Errorf("get projection %s/%s: %w", typ, aggregateID, err)
	}
	return st, nil
}

// List returns every state of projection typ, by aggregate id.
func (s *Store) List(ctx context.Context, typ string) ([]State, error) {
	rows, err := s.pool.Query(ctx, selectState+` WHERE projection_type = $1 ORDER BY aggregate_id`, typ)
	if err != nil {
		return nil, fmt.Errorf("list projection %s: %w", typ, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (State, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("list projection %s: %w", typ, err)
	}
	return out, nil
}

func get(ctx context.Context, db streams.DBTX, typ, aggregateID string, lock bool) (*State, error) {
	q := selectState + ` WHERE projection_type = $1 AND aggregate_id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	st, err := scan(db.QueryRow(ctx, q, typ, aggregateID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

func scan(r pgx.Row) (State, error) {
	var st State
	var state []byte
	var ts pgtype.Timestamptz
	err := r.Scan(&st.Type, &st.AggregateID, &state, &st.LastEventID, &ts, &st.Stream, &st.Partition, &st.LastOffset, &st.UpdatedAt)
	st.State = state
	st.LastEventTimestamp = ts.Time
	return st, err
}
