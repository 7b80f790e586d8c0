// Package eventstore is event sourcing on streamd's log (issue 9): per-key versions
// with optimistic concurrency, snapshots, exclusive writer sessions and the event type
// registry. A key is an aggregate (seed 004's store, seed 000's aggregate id); its
// events live in the stream like any other, on the key's partition, so consumer
// groups, retention and the tailer see them as usual.
//
// Versions: on a stream with key versions (ConfigureStream), every event with a key
// gets key_version 1, 2, 3, ... within (stream, key), whichever path appended it (this
// package, streams.Producer, or a plain SQL INSERT). The version is derived under the
// partition's head-row lock from streamd.key_heads, one row per key; reading a key in
// version order is a range scan of the partial index events_stream_key_version.
//
// Concurrency: Store and Session are safe for concurrent use. Checks that decide
// between writers (expected version, session holder, expiry) run in SQL under row
// locks, never in Go.
package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// Config configures a Store. A nil *Config means the defaults.
type Config struct {
	// Clock, when not nil, is the time used for session expiry (tests inject it).
	// Defaults to nil: the database's clock.
	Clock func() time.Time
	// Logger receives the store's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// OpenTimeout is how long Open waits for a key held by another session. Defaults
	// to 5s.
	OpenTimeout time.Duration
	// Registerer receives the store's metrics (streamd_eventstore_*). Defaults to
	// nil (no metrics).
	Registerer prometheus.Registerer
	// SessionTimeout is how long a session holds its key after Open or Renew.
	// Defaults to 1m.
	SessionTimeout time.Duration
}

func (c *Config) validate() error {
	if c.OpenTimeout < 0 {
		return fmt.Errorf("eventstore: Config.OpenTimeout must not be negative, got %s", c.OpenTimeout)
	}
	if c.SessionTimeout < 0 {
		return fmt.Errorf("eventstore: Config.SessionTimeout must not be negative, got %s", c.SessionTimeout)
	}
	return nil
}

// Store reads and writes keys of streams. It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	cfg     Config
	metrics *metrics
}

// New returns a Store on pool. It fails when cfg is invalid, naming the field.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = 5 * time.Second
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = time.Minute
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, cfg: c, metrics: m}, nil
}

// now returns the injected time, or an invalid value meaning the database's clock.
func (s *Store) now() pgtype.Timestamptz {
	if s.cfg.Clock == nil {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: s.cfg.Clock(), Valid: true}
}

// StreamOpts are a stream's event sourcing settings.
type StreamOpts struct {
	// EnforceEventTypes makes the stream accept only events whose type is registered
	// (RegisterEventType), on every append path. Defaults to false.
	EnforceEventTypes bool
	// KeyVersions makes the stream number each key's events 1, 2, 3, ... It costs each
	// append an upsert of one key_heads row per key (see docs/eventsourcing.md), so it
	// is off by default. Turning it on for a stream that already holds keyed events
	// numbers only the events appended from then on. Defaults to false.
	KeyVersions bool
}

// ConfigureStream sets the event sourcing settings of an existing stream. It waits for
// appends in flight to the stream. Errors: streams.ErrStreamNotFound.
func (s *Store) ConfigureStream(ctx context.Context, stream string, opts StreamOpts) error {
	_, err := s.pool.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, $2, $3)", stream, opts.KeyVersions, opts.EnforceEventTypes)
	if err != nil {
		return fmt.Errorf("configure event sourcing of %s: %w", stream, sqlerr.Wrap(err))
	}
	return nil
}

// ExpectedVersion is what an append expects of its key: AnyVersion, NoVersion, or
// ExactVersion(n).
type ExpectedVersion int64

const (
	// AnyVersion appends whatever version the key is at.
	AnyVersion ExpectedVersion = -1
	// NoVersion appends only to a key that has no events yet.
	NoVersion ExpectedVersion = 0
)

// ExactVersion appends only when the key is at version n (its last event has version
// n). ExactVersion(0) is NoVersion.
func ExactVersion(n int64) ExpectedVersion { return ExpectedVersion(n) }

// Event is an event to append to a key.
type Event struct {
	// CausationID and CorrelationID link related events. Default to empty.
	CausationID   string
	CorrelationID string
	// Data is the JSON payload. Exactly one of Data and Bytes should be set; both nil
	// is a tombstone.
	Data json.RawMessage
	// Bytes is a binary payload, for values that are not JSON.
	Bytes []byte
	// EventID identifies the event within its stream: an append whose event ids are
	// all stored already is a retry and returns the stored versions. Defaults to a
	// random UUID.
	EventID string
	// EventType names the event ("OrderPlaced"). Defaults to empty.
	EventType string
	// Headers are stored as a JSON object in the metadata column.
	Headers map[string]string
	// SchemaVersion is the event's schema version (events.version). Defaults to 1.
	SchemaVersion int32
}

// AppendResult says where the events of an append were stored.
type AppendResult struct {
	// Positions are the events' positions in the log, in the order given.
	Positions []streams.Position
	// Versions are the events' key versions, in the order given.
	Versions []int64
	// Version is the key's version after the append (the last of Versions).
	Version int64
}

// Append appends events to key of stream, atomically, if the key is at the expected
// version; otherwise it fails with ErrVersionMismatch and writes nothing. Appending
// to a key that a session holds fails with ErrSessionHeld. Errors also:
// ErrNotVersioned, ErrUnknownEventType, and the streams package's errors for bad input
// (streams.ErrInvalidArgument for an empty key or a bad expected version).
func (s *Store) Append(ctx context.Context, stream, key string, expected ExpectedVersion, events ...Event) (*AppendResult, error) {
	return s.appendTo(ctx, s.pool, stream, key, expected, "", events)
}

// AppendTx is Append inside the caller's transaction (or on a connection): the events
// commit with the caller's own writes, and the key stays locked until then.
func (s *Store) AppendTx(ctx context.Context, tx streams.DBTX, stream, key string, expected ExpectedVersion, events ...Event) (*AppendResult, error) {
	return s.appendTo(ctx, tx, stream, key, expected, "", events)
}

const appendSQL = `SELECT ord, partition, "offset", "timestamp", duplicate, key_version
FROM streamd.append_versioned($1, NULL, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, true)`

func (s *Store) appendTo(ctx context.Context, db streams.DBTX, stream, key string, expected ExpectedVersion, session string, events []Event) (*AppendResult, error) {
	res, err := s.appendEvents(ctx, db, stream, key, expected, session, events)
	s.metrics.append(err)
	return res, err
}

func (s *Store) appendEvents(ctx context.Context, db streams.DBTX, stream, key string, expected ExpectedVersion, session string, events []Event) (*AppendResult, error) {
	if key == "" {
		return nil, fmt.Errorf("append to %s: %w: the key must not be empty", stream, streams.ErrInvalidArgument)
	}
	if expected < AnyVersion {
		return nil, fmt.Errorf("append to %s/%s: %w: expected version %d (use AnyVersion, NoVersion or ExactVersion(n >= 0))",
			stream, key, streams.ErrInvalidArgument, int64(expected))
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("append to %s/%s: %w: no events", stream, key, streams.ErrInvalidArgument)
	}
	n := len(events)
	ids := make([]pgtype.Text, n)
	types := make([]string, n)
	keys := make([]string, n)
	data := make([]pgtype.Text, n)
	bin := make([][]byte, n)
	meta := make([]pgtype.Text, n)
	corr := make([]pgtype.Text, n)
	caus := make([]pgtype.Text, n)
	vers := make([]pgtype.Int4, n)
	exp := make([]pgtype.Int8, n)
	for i, e := range events {
		ids[i] = pgtype.Text{String: e.EventID, Valid: e.EventID != ""}
		types[i] = e.EventType
		keys[i] = key
		if e.Data != nil {
			data[i] = pgtype.Text{String: string(e.Data), Valid: true}
		}
		bin[i] = e.Bytes
		if len(e.Headers) > 0 {
			b, err := json.Marshal(e.Headers)
			if err != nil {
				return nil, fmt.Errorf("append to %s/%s: encode headers: %w", stream, key, err)
			}
			meta[i] = pgtype.Text{String: string(b), Valid: true}
		}
		corr[i] = pgtype.Text{String: e.CorrelationID, Valid: e.CorrelationID != ""}
		caus[i] = pgtype.Text{String: e.CausationID, Valid: e.CausationID != ""}
		vers[i] = pgtype.Int4{Int32: e.SchemaVersion, Valid: e.SchemaVersion != 0}
	}
	// The expectation is about the key before the batch: the first event carries it.
	if expected != AnyVersion {
		exp[0] = pgtype.Int8{Int64: int64(expected), Valid: true}
	}
	sess := pgtype.Text{String: session, Valid: session != ""}
	rows, err := db.Query(ctx, appendSQL, stream, ids, types, keys, data, bin, meta, corr, caus, vers, exp, sess, s.now())
	if err != nil {
		return nil, fmt.Errorf("append to %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	defer rows.Close()
	res := &AppendResult{Positions: make([]streams.Position, n), Versions: make([]int64, n)}
	got := 0
	for rows.Next() {
		var ord int32
		var p streams.Position
		var kv pgtype.Int8
		if err := rows.Scan(&ord, &p.Partition, &p.Offset, &p.Timestamp, &p.Duplicate, &kv); err != nil {
			return nil, fmt.Errorf("append to %s/%s: %w", stream, key, err)
		}
		if ord < 1 || int(ord) > n {
			return nil, fmt.Errorf("append to %s/%s: server returned position for event %d of %d", stream, key, ord, n)
		}
		res.Positions[ord-1] = p
		res.Versions[ord-1] = kv.Int64
		got++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("append to %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	if got != n {
		return nil, fmt.Errorf("append to %s/%s: server returned %d positions for %d events", stream, key, got, n)
	}
	res.Version = res.Versions[n-1]
	return res, nil
}

// Version returns the key's current version: 0 when it has no events. Errors:
// streams.ErrStreamNotFound, ErrNotVersioned.
func (s *Store) Version(ctx context.Context, stream, key string) (int64, error) {
	var v int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT h.last_version FROM streamd.key_heads h
		WHERE h.stream_name = $1 AND h.key = $2), 0) FROM streamd.require_key_versions($1)`, stream, key).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("version of %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	return v, nil
}

// StoredEvent is an event of a key as stored.
type StoredEvent struct {
	streams.Event
	// KeyVersion is the event's version within its key: 1, 2, 3, ...
	KeyVersion int64 `json:"key_version"`
}

// readSQL checks the stream as Version does: the check has no column of events, so
// PostgreSQL runs it once, as a one-time filter, before the index range scan (also
// when the key has no events, which is when it matters).
const readSQL = `SELECT e.partition, e."offset", e.event_id, e.event_type, e.data, e.data_bytes, e.metadata,
       e."timestamp", e.correlation_id, e.causation_id, e.version, e.key_version
  FROM streamd.events e
 WHERE e.stream_name = $1 AND e.key = $2 AND e.key_version > $3
   AND (SELECT true FROM streamd.require_key_versions($1))
 ORDER BY e.key_version
 LIMIT $4`

// Read returns up to limit events of key with versions above after, in version
// order (after = 0 reads from the first event; limit <= 0 means all). Events deleted
// by retention are missing from the result; a key without events reads as empty.
// Errors: streams.ErrStreamNotFound, ErrNotVersioned (as Version and Load).
func (s *Store) Read(ctx context.Context, stream, key string, after int64, limit int) ([]StoredEvent, error) {
	return s.read(ctx, s.pool, stream, key, after, limit)
}

func (s *Store) read(ctx context.Context, db streams.DBTX, stream, key string, after int64, limit int) ([]StoredEvent, error) {
	if after < 0 {
		return nil, fmt.Errorf("read %s/%s: %w: version %d is negative", stream, key, streams.ErrInvalidArgument, after)
	}
	lim := pgtype.Int8{Int64: int64(limit), Valid: limit > 0}
	rows, err := db.Query(ctx, readSQL, stream, key, after, lim)
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	defer rows.Close()
	var out []StoredEvent
	for rows.Next() {
		var e StoredEvent
		var data, meta []byte
		var corr, caus pgtype.Text
		if err := rows.Scan(&e.Partition, &e.Offset, &e.EventID, &e.EventType, &data, &e.Bytes, &meta,
			&e.Timestamp, &corr, &caus, &e.Version, &e.KeyVersion); err != nil {
			return nil, fmt.Errorf("read %s/%s: %w", stream, key, err)
		}
		e.Stream, e.Key, e.CorrelationID, e.CausationID = stream, key, corr.String, caus.String
		if data != nil {
			e.Data = json.RawMessage(data)
		}
		if meta != nil {
			if err := json.Unmarshal(meta, &e.Headers); err != nil {
				return nil, fmt.Errorf("read %s/%s: headers of version %d: %w", stream, key, e.KeyVersion, err)
			}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	return out, nil
}

// isHeld reports whether err says another session holds the key.
func isHeld(err error) bool { return errors.Is(err, ErrSessionHeld) }
