// Package streams is the persistent log: streams with partitions, appends (batched,
// in the caller's transaction, or by plain SQL INSERT), fetch by offset range and
// offsets by time.
//
// Guarantees (docs/architecture.md says where each is enforced and tested):
//   - L1: within a partition, offsets are 0, 1, 2, ... with no gaps and become visible
//     in offset order, because each append locks its partition's head row until it
//     commits.
//   - L2: an append is atomic; ProduceTx appends inside the caller's transaction.
//   - L3: a plain INSERT INTO streamd.events gets a correct offset from a trigger.
//   - L4: a record whose EventID the stream holds is stored once.
package streams

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/internal/sqlerr"
)

// DBTX is what streamd's libraries need from a connection, pool or transaction
// (*pgxpool.Pool, *pgx.Conn and pgx.Tx implement it). It is declared once, here: the
// ...Tx functions of messages, streamconfig and consumergroup take it too.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ClientConfig configures a Client. A nil *ClientConfig means the defaults.
type ClientConfig struct {
	// Logger receives the client's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxAppendsInFlight is the most transactions the client's Produce calls of one
	// partition and at most 16 records run at once. Calls made while that many run
	// wait, and are then appended together, in one transaction and one round trip,
	// each still all or nothing with its own result (see Produce). Negative turns
	// the coalescing off: every call is a transaction of its own. Defaults to
	// DefaultMaxAppendsInFlight (or the pool's MaxConns, if lower). A transaction
	// that has run for 50 ms (waiting for a head row another transaction holds) no
	// longer counts, up to the pool's MaxConns transactions in all. The slots count
	// transactions of such calls, not connections: calls of more records or of
	// several partitions do not take one. A lower value saves CPU (a commit and a
	// round trip per call shared) at the cost of parallelism; a higher one the
	// reverse (bench/RESULTS.md, sessions 11 and 13). A shared transaction runs its
	// calls' statements one after another on one backend, so at the default about two
	// backends append the small calls of one Client: a service that makes many
	// concurrent small calls against a database with many cores to spare may raise it
	// (the default was measured on 2 cores only).
	MaxAppendsInFlight int
}

// DefaultMaxAppendsInFlight is ClientConfig.MaxAppendsInFlight's default: two
// transactions of small Produce calls at once, the calls made meanwhile appended
// together in the next (group commit). Measured on 2 cores with 4 concurrent
// one-record callers (bench/RESULTS.md, session 13): against a transaction per call
// (the pool's MaxConns in flight), the client and server spent 23-37% less CPU per
// record at 2 in flight and 29-51% less at 1; 2 keeps a second transaction running
// while one commits.
const DefaultMaxAppendsInFlight = 2

// Client administers streams and reads them. It is safe for concurrent use.
type Client struct {
	pool    *pgxpool.Pool
	logger  *slog.Logger
	appends *appendQueue // nil: no coalescing
}

// NewClient returns a Client on pool.
func NewClient(pool *pgxpool.Pool, cfg *ClientConfig) *Client {
	c := &Client{pool: pool, logger: slog.Default()}
	inFlight := 0
	if pool != nil {
		inFlight = min(DefaultMaxAppendsInFlight, int(pool.Config().MaxConns))
	}
	if cfg != nil {
		if cfg.Logger != nil {
			c.logger = cfg.Logger
		}
		if cfg.MaxAppendsInFlight != 0 {
			inFlight = cfg.MaxAppendsInFlight
		}
	}
	if inFlight > 0 {
		c.appends = newAppendQueue(pool, inFlight)
	}
	return c
}

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// StreamInfo describes a stream.
type StreamInfo struct {
	Name            string `json:"name"`
	Partitions      int32  `json:"partitions"`
	MaxPayloadBytes int32  `json:"max_payload_bytes"`
	// ValueFormat is "any" (JSON or bytes, as each writer chose) or "json" (Kafka
	// producers' values must be JSON, stored as data). See SetValueFormat.
	ValueFormat   string          `json:"value_format"`
	CreatedAt     time.Time       `json:"created_at"`
	PartitionInfo []PartitionInfo `json:"partition_info,omitempty"`
}

// PartitionInfo describes one partition from its head row.
type PartitionInfo struct {
	Partition      int32 `json:"partition"`
	LogStartOffset int64 `json:"log_start_offset"`
	// NextOffset is the log end: the offset the next event gets.
	NextOffset     int64      `json:"next_offset"`
	LastAppendedAt *time.Time `json:"last_appended_at,omitempty"`
}

// CreateStream creates stream name with the given number of partitions, or grows an
// existing stream to that many. Fewer partitions than the stream has is refused with
// ErrPartitionsDecrease; an invalid name with ErrInvalidName.
func (c *Client) CreateStream(ctx context.Context, name string, partitions int32) error {
	return CreateStreamTx(ctx, c.pool, name, partitions)
}

// CreateStreamTx is CreateStream on db (a pool, connection or transaction).
func CreateStreamTx(ctx context.Context, db DBTX, name string, partitions int32) error {
	if !ValidName(name) {
		return invalid(ErrInvalidName, "stream name %q: use 1 to 249 characters of A-Z a-z 0-9 . _ -", name)
	}
	if partitions < 1 || partitions > 10000 {
		return invalid(ErrInvalidArgument, "stream %s: partition count %d must be between 1 and 10000", name, partitions)
	}
	if _, err := db.Exec(ctx, "SELECT streamd.create_stream($1, $2)", name, partitions); err != nil {
		return fmt.Errorf("create stream %s: %w", name, sqlerr.Wrap(err))
	}
	return nil
}

// DeleteStream deletes a stream and all its events. It returns ErrStreamNotFound when
// there is no such stream.
func (c *Client) DeleteStream(ctx context.Context, name string) error {
	// Its read indexes first: partial indexes on its name, which would outlive it.
	if err := c.dropReadIndexes(ctx, name); err != nil {
		return err
	}
	var existed bool
	if err := c.pool.QueryRow(ctx, "SELECT streamd.delete_stream($1)", name).Scan(&existed); err != nil {
		return fmt.Errorf("delete stream %s: %w", name, sqlerr.Wrap(err))
	}
	if !existed {
		return fmt.Errorf("delete stream %s: %w", name, ErrStreamNotFound)
	}
	return nil
}

// ListStreams returns every stream, by name.
func (c *Client) ListStreams(ctx context.Context) ([]StreamInfo, error) {
	rows, err := c.pool.Query(ctx, `SELECT stream_name, partitions, max_payload_bytes, value_format, created_at
		FROM streamd.streams ORDER BY stream_name`)
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamInfo, error) {
		var s StreamInfo
		err := r.Scan(&s.Name, &s.Partitions, &s.MaxPayloadBytes, &s.ValueFormat, &s.CreatedAt)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return out, nil
}

// DescribeStream returns a stream with its partitions' log start and end offsets.
func (c *Client) DescribeStream(ctx context.Context, name string) (*StreamInfo, error) {
	return DescribeStreamTx(ctx, c.pool, name)
}

// DescribeStreamTx is DescribeStream on db.
func DescribeStreamTx(ctx context.Context, db DBTX, name string) (*StreamInfo, error) {
	var s StreamInfo
	err := db.QueryRow(ctx, `SELECT stream_name, partitions, max_payload_bytes, value_format, created_at
		FROM streamd.streams WHERE stream_name = $1`, name).Scan(&s.Name, &s.Partitions, &s.MaxPayloadBytes, &s.ValueFormat, &s.CreatedAt)
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("describe stream %q: %w", name, ErrStreamNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("describe stream %s: %w", name, sqlerr.Wrap(err))
	}
	if s.PartitionInfo, err = partitionHeads(ctx, db, name); err != nil {
		return nil, fmt.Errorf("describe stream %s: %w", name, sqlerr.Wrap(err))
	}
	return &s, nil
}

// PartitionHeads returns the log start offset and the log end (next offset) of every
// partition of stream, by partition, in one read of the head rows, without the
// stream's row: what a reader of several partitions checks before fetching those that
// may have something new (the Kafka fetch). A stream that does not exist has no
// partitions: an empty result, no error.
func (c *Client) PartitionHeads(ctx context.Context, stream string) ([]PartitionInfo, error) {
	heads, err := partitionHeads(ctx, c.pool, stream)
	if err != nil {
		return nil, fmt.Errorf("partition heads of %s: %w", stream, err)
	}
	return heads, nil
}

// StreamCreatedAtTx returns when stream name was created, on db: its identity (a
// stream deleted and created again under its name has another one), from its row
// alone, without the partition heads DescribeStreamTx reads. It fails with
// ErrStreamNotFound when there is no such stream.
func StreamCreatedAtTx(ctx context.Context, db DBTX, name string) (time.Time, error) {
	var at time.Time
	err := db.QueryRow(ctx, `SELECT created_at FROM streamd.streams WHERE stream_name = $1`, name).Scan(&at)
	if err == pgx.ErrNoRows {
		return time.Time{}, fmt.Errorf("stream %q created at: %w", name, ErrStreamNotFound)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("stream %s created at: %w", name, err)
	}
	return at, nil
}

func partitionHeads(ctx context.Context, db DBTX, stream string) ([]PartitionInfo, error) {
	rows, err := db.Query(ctx, `SELECT partition, log_start_offset, next_offset, last_appended_at
		FROM streamd.stream_partitions WHERE stream_name = $1 ORDER BY partition`, stream)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionInfo, error) {
		var p PartitionInfo
		err := r.Scan(&p.Partition, &p.LogStartOffset, &p.NextOffset, &p.LastAppendedAt)
		return p, err
	})
}

// Produce appends records atomically in one transaction (L2) and returns their
// positions in the order given. Records may name several streams. For many small
// concurrent appends, a Producer batches them into fewer transactions.
//
// Concurrent calls of one partition and at most 16 records share transactions: while
// ClientConfig.MaxAppendsInFlight of them run, further calls wait and are then
// appended together, in one transaction and one round trip (a Kafka producer's
// group commit, without its linger: a call made while fewer run starts at once, once
// the goroutines ready to run have had their turn to join it).
// Each call's records are still all or nothing, and its result its own: when a shared
// transaction fails, each of its calls is appended again alone, so one call's bad
// records fail only that call. A call that waits returns ctx's error, having written
// nothing, if ctx ends before its transaction starts.
func (c *Client) Produce(ctx context.Context, records ...Record) ([]Position, error) {
	if len(records) > 0 && oneStreamAndPartition(records) {
		if err := validateRecords(records); err != nil {
			return nil, err
		}
		// The one-statement and COPY paths need every event id up front (a retry
		// through streamd.append() must name the same ones).
		recs := make([]Record, len(records))
		copy(recs, records)
		for i := range recs {
			if recs[i].EventID == "" {
				recs[i].EventID = newEventID()
			}
		}
		if c.appends != nil && len(recs) <= coalesceMax {
			return c.appends.produce(ctx, recs[0].Stream, *recs[0].Partition, recs)
		}
		return appendOwnTx(ctx, c.pool, recs[0].Stream, recs)
	}
	if len(records) > 0 && oneStream(records) {
		// One call of streamd.append is one statement, atomic on its own: no
		// BEGIN/COMMIT round trips around it.
		if err := validateRecords(records); err != nil {
			return nil, err
		}
		return appendBatch(ctx, c.pool, records[0].Stream, records)
	}
	var out []Position
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		out, err = ProduceTx(ctx, tx, records...)
		return err
	})
	return out, err
}

func oneStream(records []Record) bool {
	for i := range records {
		if records[i].Stream != records[0].Stream {
			return false
		}
	}
	return true
}

// ProduceTx appends records inside the caller's transaction tx (the transactional
// outbox): they become visible when, and only if, tx commits. Positions are final
// once tx commits.
//
// The head rows of the partitions written stay locked until tx ends: other appends to
// those partitions wait for it. Keep such transactions short.
func ProduceTx(ctx context.Context, tx DBTX, records ...Record) ([]Position, error) {
	if len(records) == 0 {
		return nil, nil
	}
	if err := validateRecords(records); err != nil {
		return nil, err
	}
	out := make([]Position, len(records))
	// One append call per stream, in name order so that transactions touching several
	// streams lock head rows in one global order.
	for _, g := range groupByStream(records) {
		pos, err := appendBatch(ctx, tx, g.stream, g.records)
		if err != nil {
			return nil, err
		}
		for i, idx := range g.index {
			out[idx] = pos[i]
		}
	}
	return out, nil
}

// oneStreamAndPartition reports whether records share one stream and one explicit
// partition.
func oneStreamAndPartition(records []Record) bool {
	first := &records[0]
	if first.Partition == nil {
		return false
	}
	for i := range records {
		r := &records[i]
		if r.Stream != first.Stream || r.Partition == nil || *r.Partition != *first.Partition {
			return false
		}
	}
	return true
}

// MaxIDBytes is the longest event id, event type or correlation id a record may have,
// in bytes: they are indexed, and an index row holds about 2.7 kB.
const MaxIDBytes = 1024

func validateRecords(records []Record) error {
	for i := range records {
		if err := validateRecord(&records[i]); err != nil {
			return err
		}
	}
	return nil
}

func validateRecord(r *Record) error {
	if !ValidName(r.Stream) {
		return invalid(ErrInvalidName, "stream name %q: use 1 to 249 characters of A-Z a-z 0-9 . _ -", r.Stream)
	}
	if r.Partition != nil && *r.Partition < 0 {
		return invalid(ErrPartitionNotFound, "stream %s: partition %d is negative", r.Stream, *r.Partition)
	}
	if r.Data != nil && r.Bytes != nil {
		return invalid(ErrInvalidArgument, "stream %s: a record has both Data and Bytes; set one", r.Stream)
	}
	if r.Data != nil && !json.Valid(r.Data) {
		return invalid(ErrInvalidJSON, "stream %s: record data is not valid JSON", r.Stream)
	}
	if r.Data != nil {
		if why := pgtext.JSONProblem(r.Data); why != "" {
			return invalid(ErrInvalidJSON, "stream %s: record data: %s", r.Stream, why)
		}
	}
	for _, f := range [...]struct{ name, v string }{{"key", r.Key}, {"event id", r.EventID}, {"event type", r.EventType},
		{"correlation id", r.CorrelationID}, {"causation id", r.CausationID}} {
		if why := pgtext.TextProblem(f.v); why != "" {
			return invalid(ErrInvalidArgument, "stream %s: record %s: %s", r.Stream, f.name, why)
		}
	}
	for k, v := range r.Headers {
		if why := cmp.Or(pgtext.TextProblem(k), pgtext.TextProblem(v)); why != "" {
			return invalid(ErrInvalidArgument, "stream %s: record header %q: %s", r.Stream, k, why)
		}
	}
	// Indexed (the unique event id index, the read indexes): a longer value failed the
	// append or, stored before its read index, the index's build (SQLSTATE 54000).
	for _, f := range [...]struct{ name, v string }{{"event id", r.EventID}, {"event type", r.EventType}, {"correlation id", r.CorrelationID}} {
		if len(f.v) > MaxIDBytes {
			return invalid(ErrInvalidArgument, "stream %s: record %s is longer than %d bytes", r.Stream, f.name, MaxIDBytes)
		}
	}
	if r.KeyBytes != nil {
		return invalid(ErrInvalidArgument, "stream %s: KeyBytes are appended by AppendPartition only", r.Stream)
	}
	if r.RawHeaders != nil {
		return invalid(ErrInvalidArgument, "stream %s: RawHeaders are appended by AppendPartition only", r.Stream)
	}
	if r.Version < 0 {
		return invalid(ErrInvalidArgument, "stream %s: version %d is negative", r.Stream, r.Version)
	}
	return nil
}

// SetValueFormat sets what stream's values are: "any" (the default) or "json" (a
// Kafka producer's values must be JSON and are stored as data). Another value is
// ErrInvalidArgument; an unknown stream ErrStreamNotFound.
func (c *Client) SetValueFormat(ctx context.Context, stream, format string) error {
	return SetValueFormatTx(ctx, c.pool, stream, format)
}

// SetValueFormatTx is SetValueFormat on db.
func SetValueFormatTx(ctx context.Context, db DBTX, stream, format string) error {
	if format != "any" && format != "json" {
		return invalid(ErrInvalidArgument, "stream %s: value format %q is not any or json", stream, format)
	}
	return setStreamColumn(ctx, db, stream, "value_format", format)
}

// SetMaxPayloadBytesTx sets the largest payload (data or data_bytes) stream accepts,
// on db. n must be positive (ErrInvalidArgument); an unknown stream is
// ErrStreamNotFound. Stored events are not checked again.
func SetMaxPayloadBytesTx(ctx context.Context, db DBTX, stream string, n int32) error {
	if n < 1 {
		return invalid(ErrInvalidArgument, "stream %s: max payload bytes %d must be positive", stream, n)
	}
	return setStreamColumn(ctx, db, stream, "max_payload_bytes", n)
}

func setStreamColumn(ctx context.Context, db DBTX, stream, column string, v any) error {
	tag, err := db.Exec(ctx, "UPDATE streamd.streams SET "+pgx.Identifier{column}.Sanitize()+" = $2, updated_at = now() WHERE stream_name = $1", stream, v)
	if err != nil {
		return fmt.Errorf("set %s of %s: %w", column, stream, sqlerr.Wrap(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set %s of %s: %w", column, stream, ErrStreamNotFound)
	}
	return nil
}
