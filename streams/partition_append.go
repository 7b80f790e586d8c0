package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/internal/sqlerr"
)

// Header is one record header as Kafka has them: headers are ordered, a key may
// repeat, and a value is bytes (nil: a null value). Record.RawHeaders keeps them
// exactly, where Record.Headers (a map of strings) cannot.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// ProducerSequence identifies a batch of an idempotent producer (Kafka's producer id,
// epoch and base sequence): the log appends a producer's batches to a partition in
// sequence order, once each.
type ProducerSequence struct {
	// ProducerID is an id from InitProducer.
	ProducerID int64
	// Epoch is the producer's epoch; a batch of an older epoch than the partition has
	// seen is refused with ErrProducerFenced.
	Epoch int16
	// FirstSequence is the sequence of the batch's first record; each record counts
	// one. It must follow the last record appended (0 for a new producer or epoch),
	// else ErrOutOfOrderSequence; a retry of one of the last 5 batches is reported as
	// a duplicate with its original position.
	FirstSequence int32
}

// AppendPartitionOpts are the options of AppendPartition. A nil
// *AppendPartitionOpts means the defaults.
type AppendPartitionOpts struct {
	// Producer, when set, makes the append idempotent (see ProducerSequence).
	// Defaults to nil: no sequence checks.
	Producer *ProducerSequence
}

// BatchPosition is where AppendPartition stored a batch: its records have the
// offsets BaseOffset, BaseOffset+1, ... and all the log time Timestamp.
type BatchPosition struct {
	BaseOffset int64
	Timestamp  time.Time
	// Duplicate is true when the batch was a producer's retry of a batch the
	// partition holds: nothing was stored, and the position is the original one.
	Duplicate bool
}

// AppendPartition appends records to one partition of stream atomically (L2), all or
// nothing, in a transaction of its own, with COPY: the path of Kafka's Produce. Each
// record's Partition must be nil or partition. Records keep their RawHeaders and
// KeyBytes exactly (Produce and the Producer refuse them). A record without an EventID gets a UUIDv7. On a stream whose ValueFormat is "json", a record's Bytes must be JSON and are
// stored as its Data.
//
// Errors: ErrStreamNotFound, ErrPartitionNotFound, ErrPayloadTooLarge (a payload over
// the stream's max_payload_bytes), ErrInvalidJSON, ErrInvalidArgument (bad records; a
// stream with per-key versions or enforced event types, which takes appends through
// Produce only), and with a producer ErrOutOfOrderSequence, ErrDuplicateSequence or
// ErrProducerFenced. On
// every error nothing was written.
func (c *Client) AppendPartition(ctx context.Context, stream string, partition int32, records []Record, opts *AppendPartitionOpts) (*BatchPosition, error) {
	if len(records) == 0 {
		return nil, invalid(ErrInvalidArgument, "append to %s/%d: no records", stream, partition)
	}
	if partition < 0 {
		return nil, invalid(ErrPartitionNotFound, "append to %s: partition %d is negative", stream, partition)
	}
	maxPayload := 0
	rows := make([][]any, len(records))
	for i := range records {
		r := records[i]
		if r.Stream == "" {
			r.Stream = stream
		}
		if r.Stream != stream || (r.Partition != nil && *r.Partition != partition) {
			return nil, invalid(ErrInvalidArgument, "append to %s/%d: record %d names %s/%v", stream, partition, i, r.Stream, r.Partition)
		}
		raw, keyBytes := r.RawHeaders, r.KeyBytes
		r.RawHeaders, r.KeyBytes = nil, nil
		if err := validateRecord(&r); err != nil {
			return nil, err
		}
		if keyBytes != nil && r.Key != "" {
			return nil, invalid(ErrInvalidArgument, "append to %s/%d: record %d has both Key and KeyBytes", stream, partition, i)
		}
		var hkeys []string
		var hvals [][]byte
		if raw != nil {
			hkeys = make([]string, len(raw))
			hvals = make([][]byte, len(raw))
			for j, h := range raw {
				if why := pgtext.TextProblem(h.Key); why != "" {
					return nil, invalid(ErrInvalidArgument, "append to %s/%d: record %d header %d key: %s", stream, partition, i, j, why)
				}
				hkeys[j], hvals[j] = h.Key, h.Value
			}
		}
		maxPayload = max(maxPayload, len(r.Data)+len(r.Bytes))
		if r.EventID == "" {
			r.EventID = newEventID()
		}
		version := r.Version
		if version == 0 {
			version = 1
		}
		var data, meta any
		if r.Data != nil {
			data = []byte(r.Data)
		}
		if len(r.Headers) > 0 {
			b, err := json.Marshal(r.Headers)
			if err != nil {
				return nil, fmt.Errorf("append to %s: encode headers: %w", stream, err)
			}
			meta = b
		}
		var hk, hv any
		if hkeys != nil {
			hk, hv = hkeys, hvals
		}
		rows[i] = []any{stream, partition, nil, r.EventID, r.EventType, nullable(r.Key), data, r.Bytes,
			meta, nil, nullable(r.CorrelationID), nullable(r.CausationID), version, hk, hv, keyBytes}
	}
	var pid, first any
	var epoch any
	if opts != nil && opts.Producer != nil {
		pid, epoch, first = opts.Producer.ProducerID, opts.Producer.Epoch, opts.Producer.FirstSequence
	}
	var pos *BatchPosition
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var status, format string
		var base int64
		var ts time.Time
		err := tx.QueryRow(ctx, "SELECT status, base, ts, value_format FROM streamd.append_reserve_producer($1, $2, $3, $4, $5, $6, $7)",
			stream, partition, len(records), maxPayload, pid, epoch, first).Scan(&status, &base, &ts, &format)
		if err != nil {
			return sqlerr.Wrap(err)
		}
		pos = &BatchPosition{BaseOffset: base, Timestamp: ts, Duplicate: status == "duplicate"}
		if pos.Duplicate {
			return nil
		}
		for i := range rows {
			rows[i][2], rows[i][9] = base+int64(i), ts
			// A stream of JSON values keeps them as data, where SQL can query them; a
			// value that is not JSON is refused, and the rollback gives the offsets back.
			if b, ok := rows[i][7].([]byte); ok && b != nil && format == "json" {
				if !json.Valid(b) {
					return invalid(ErrInvalidJSON, "stream %s takes JSON values only: record %d is not JSON", stream, i)
				}
				if why := pgtext.JSONProblem(b); why != "" {
					return invalid(ErrInvalidJSON, "stream %s: record %d: %s", stream, i, why)
				}
				rows[i][6], rows[i][7] = b, nil
			}
		}
		_, err = tx.CopyFrom(ctx, pgx.Identifier{"streamd", "events"}, partitionCopyColumns, pgx.CopyFromRows(rows))
		return sqlerr.Wrap(err)
	})
	if err != nil {
		return nil, fmt.Errorf("append to %s/%d: %w", stream, partition, err)
	}
	return pos, nil
}

var partitionCopyColumns = append(append([]string(nil), copyColumns...), "header_keys", "header_values", "key_bytes")

// InitProducer returns a new producer id (producerID < 0), or bumps the epoch of an
// existing one (producerID and its current epoch), for AppendPartition's
// ProducerSequence. A stale or unknown id and epoch is ErrProducerFenced.
func (c *Client) InitProducer(ctx context.Context, producerID int64, epoch int16) (int64, int16, error) {
	var id *int64
	if producerID >= 0 {
		id = &producerID
	}
	var outID int64
	var outEpoch int16
	err := c.pool.QueryRow(ctx, "SELECT producer_id, epoch FROM streamd.init_producer($1, $2)", id, epoch).Scan(&outID, &outEpoch)
	if err != nil {
		return 0, 0, fmt.Errorf("init producer %d: %w", producerID, sqlerr.Wrap(err))
	}
	return outID, outEpoch, nil
}

// ExpiredProducers is what ExpireProducers deleted.
type ExpiredProducers struct {
	// PartitionStates counts the (stream, partition, producer) sequence states.
	PartitionStates int64
	// Producers counts the producer ids forgotten.
	Producers int64
}

// ExpireProducersOpts are ExpireProducers' per-call knobs. A nil value means the
// defaults.
type ExpireProducersOpts struct {
	// Now is the time idleness is measured from. Defaults to the database's clock.
	Now time.Time
}

// ExpireProducers forgets idempotent producers' state that has not been used for
// idle (Kafka's producer.id.expiration.ms): a producer's sequences on a partition it
// appended nothing to for idle, and a producer id with no partition state left that
// took no id or epoch for idle. A producer that comes back afterwards is new to the
// partition (its next batch must start at sequence 0, else ErrOutOfOrderSequence, and
// its InitProducer gets a new id); a retry of a batch from before is no longer
// recognised as one. The coordinator's leader runs it (streamd serve). idle must be
// positive (else ErrInvalidArgument, nothing deleted).
func (c *Client) ExpireProducers(ctx context.Context, idle time.Duration, opts *ExpireProducersOpts) (ExpiredProducers, error) {
	var out ExpiredProducers
	if idle <= 0 {
		return out, invalid(ErrInvalidArgument, "expire producers: the idle time %v must be positive", idle)
	}
	var now *time.Time
	if opts != nil && !opts.Now.IsZero() {
		now = &opts.Now
	}
	err := c.pool.QueryRow(ctx, "SELECT partition_states, producers FROM streamd.expire_producers($1, $2)", idle, now).
		Scan(&out.PartitionStates, &out.Producers)
	if err != nil {
		return ExpiredProducers{}, fmt.Errorf("expire producers: %w", sqlerr.Wrap(err))
	}
	return out, nil
}

// DeleteBefore deletes the records of a partition below offset (Kafka's
// DeleteRecords): the log start moves to offset at once (fetches below it fail with
// an *OffsetOutOfRangeError), then the rows are deleted in batches. offset -1 means
// the log end. It returns the new log start. An offset past the log end or below
// -1 is an *OffsetOutOfRangeError (Kafka's answer to both) and changes nothing.
func (c *Client) DeleteBefore(ctx context.Context, stream string, partition int32, offset int64) (int64, error) {
	if partition < 0 {
		return 0, invalid(ErrPartitionNotFound, "delete records of %s: partition %d is negative", stream, partition)
	}
	info, err := c.DescribeStream(ctx, stream)
	if err != nil {
		return 0, err
	}
	if int(partition) >= len(info.PartitionInfo) {
		return 0, invalid(ErrPartitionNotFound, "delete records of %s: no partition %d (it has %d)", stream, partition, info.Partitions)
	}
	p := info.PartitionInfo[partition]
	if offset == -1 {
		offset = p.NextOffset
	}
	if offset > p.NextOffset || offset < 0 {
		return 0, &OffsetOutOfRangeError{Stream: stream, Partition: partition, Offset: offset,
			LogStartOffset: p.LogStartOffset, NextOffset: p.NextOffset}
	}
	var ls int64
	if err := c.pool.QueryRow(ctx, "SELECT streamd.retention_advance($1, $2, $3)", stream, partition, offset).Scan(&ls); err != nil {
		return 0, fmt.Errorf("delete records of %s/%d: %w", stream, partition, sqlerr.Wrap(err))
	}
	for {
		var n int
		if err := c.pool.QueryRow(ctx, "SELECT streamd.retention_delete_batch($1, $2, 5000)", stream, partition).Scan(&n); err != nil {
			return ls, fmt.Errorf("delete records of %s/%d: %w", stream, partition, sqlerr.Wrap(err))
		}
		if n == 0 {
			return ls, nil
		}
	}
}

// ErrOutOfOrderSequence and ErrProducerFenced are AppendPartition's producer errors.
var (
	// ErrOutOfOrderSequence: an idempotent producer's batch does not follow the last
	// one it appended to the partition (a batch was lost in between).
	ErrOutOfOrderSequence = sqlerr.ErrOutOfOrderSequence
	// ErrProducerFenced: a producer epoch older than one the partition has seen, or a
	// stale InitProducer.
	ErrProducerFenced = sqlerr.ErrProducerFenced
	// ErrDuplicateSequence: an idempotent producer's batch below the last sequence
	// appended, older than the last 5 batches: it was appended before, but its
	// position is no longer known.
	ErrDuplicateSequence = sqlerr.ErrDuplicateSequence
)
