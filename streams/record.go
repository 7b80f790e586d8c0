package streams

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"regexp"
	"time"
)

// Record is an event to append.
type Record struct {
	// Stream is the stream to append to. Required.
	Stream string
	// Key routes the record: records with the same key go to the same partition (unless
	// Partition is set). Empty means no key (stored as NULL).
	Key string
	// KeyBytes is a key that is not text (Kafka keys are bytes): not UTF-8, holding a
	// NUL byte, or empty (non-nil and empty is an empty key, not none). It is kept
	// exactly in key_bytes, with key NULL; set at most one of Key and KeyBytes, and a
	// key that is text goes in Key. Only AppendPartition takes it; Produce, ProduceTx
	// and the Producer refuse it.
	KeyBytes []byte
	// Partition, when not nil, names the partition explicitly. See PartitionOf.
	Partition *int32
	// EventID identifies the record within its stream: appending a record whose
	// EventID the stream already holds stores nothing and returns the original
	// position (Position.Duplicate). Empty means the client assigns a UUIDv7 (unique,
	// and ordered by time, which keeps the stream's event id index append-mostly);
	// set it to make retries across processes idempotent. At most MaxIDBytes.
	EventID string
	// EventType is a free-form type name ("OrderPlaced"). Empty is allowed. At most
	// MaxIDBytes.
	EventType string
	// Data is the JSON payload. Data and Bytes both nil is a tombstone (NULL data).
	Data json.RawMessage
	// Bytes is a binary payload, stored in data_bytes, for values that are not JSON.
	// At most one of Data and Bytes may be set.
	Bytes []byte
	// Headers are stored as a JSON object in the metadata column.
	Headers map[string]string
	// RawHeaders are headers kept exactly: in order, keys may repeat, values are
	// bytes (stored in header_keys and header_values). Only AppendPartition takes
	// them; Produce, ProduceTx and the Producer refuse them.
	RawHeaders []Header
	// CorrelationID and CausationID link related events. CorrelationID is at most
	// MaxIDBytes.
	CorrelationID string
	CausationID   string
	// Version is the event's schema version. Zero means 1.
	Version int32
}

// PartitionOf returns a pointer to p, for Record.Partition.
func PartitionOf(p int32) *int32 { return &p }

// Position is where an appended record was stored.
type Position struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
	// Timestamp is the log's time for the record; monotonic within a partition.
	Timestamp time.Time `json:"timestamp"`
	// Duplicate is true when the stream already held the record's EventID and this
	// append stored nothing; the position is the original one. After an attempt
	// whose outcome was unknown (a transaction shared with other Produce calls that
	// lost its connection or ended with another call's ctx at its commit), the
	// record may have been stored by that attempt of this same call.
	Duplicate bool `json:"duplicate"`
}

// Event is a stored record, as Fetch returns it.
type Event struct {
	Stream    string            `json:"stream"`
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	EventID   string            `json:"event_id"`
	EventType string            `json:"event_type"`
	Key       string            `json:"key,omitempty"`
	Data      json.RawMessage   `json:"data"`
	Bytes     []byte            `json:"data_bytes,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	// KeyBytes is a key stored as bytes (Record.KeyBytes: a Kafka key that is not
	// text, or an empty one); nil when the key is text (Key) or there is none.
	KeyBytes []byte `json:"key_bytes,omitempty"`
	// RawHeaders are the headers appended as RawHeaders (Kafka's), exactly.
	RawHeaders    []Header  `json:"raw_headers,omitempty"`
	Timestamp     time.Time `json:"timestamp"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	CausationID   string    `json:"causation_id,omitempty"`
	Version       int32     `json:"version"`
}

// Size is the payload size that MaxBytes limits count: data plus key.
func (e *Event) Size() int { return len(e.Data) + len(e.Bytes) + len(e.Key) + len(e.KeyBytes) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// ValidName reports whether name is a valid stream name: 1 to 249 characters of
// [A-Za-z0-9._-], and not "." or "..". The SQL function streamd.valid_stream_name
// applies the same rule.
func ValidName(name string) bool {
	return nameRE.MatchString(name) && name != "." && name != ".."
}

// PartitionForKey returns the partition of key among n partitions: the first four
// bytes of SHA-256 of the key, big-endian, modulo n. The SQL function
// streamd.partition_for_key computes the same, so a plain SQL INSERT and the Go
// producer route a key to the same partition.
func PartitionForKey(key string, n int32) int32 {
	sum := sha256.Sum256([]byte(key))
	return int32(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
}
