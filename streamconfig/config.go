// Package streamconfig stores typed per-stream configuration in
// streamd.stream_configurations (seed 003's columns: retention_config,
// dead_letter_config, lifecycle_config, performance_config, access_control_config,
// tags), validated on write with errors that name the field.
//
// The retention section is the JSON face of streamd.retention_policies, the table that
// retention executes: a write of either is mirrored to the other by triggers in the
// same statement (docs/retention.md), so Set here and an INSERT into
// retention_policies from SQL are two doors to the same settings.
package streamconfig

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/streamd/streamd/internal/sqlerr"
)

// CleanupPolicy says what retention does to a stream's old records.
type CleanupPolicy string

// The cleanup policies, as in Kafka's cleanup.policy.
const (
	// CleanupDelete deletes a prefix of each partition by age, count or size.
	CleanupDelete CleanupPolicy = "delete"
	// CleanupCompact keeps the latest record per key and drops old tombstones.
	CleanupCompact CleanupPolicy = "compact"
	// CleanupCompactDelete does both.
	CleanupCompactDelete CleanupPolicy = "compact,delete"
)

// Config is the whole configuration of one stream. A nil section is absent (NULL in
// the table).
type Config struct {
	// AccessControl lists the roles that may read and write the stream.
	AccessControl *AccessControl `json:"access_control_config,omitempty"`
	// DeadLetter says where records a group gives up on go.
	DeadLetter *DeadLetter `json:"dead_letter_config,omitempty"`
	// Lifecycle holds archival and expiry settings of the stream itself.
	Lifecycle *Lifecycle `json:"lifecycle_config,omitempty"`
	// Performance holds client tuning hints.
	Performance *Performance `json:"performance_config,omitempty"`
	// Retention is the stream's retention policy (streamd.retention_policies).
	Retention *Retention `json:"retention_config,omitempty"`
	// Tags are free-form labels.
	Tags map[string]string `json:"tags,omitempty"`
}

// Retention is the retention_config section. Limits apply per partition; a nil limit
// is no limit. JSON keys are the seed's camelCase.
type Retention struct {
	// CleanupPolicy: delete, compact or compact,delete. Defaults to delete.
	CleanupPolicy CleanupPolicy `json:"cleanupPolicy,omitempty"`
	// Enabled says whether the scheduler applies the policy. Defaults to true.
	Enabled *bool `json:"enabled,omitempty"`
	// MaxAge deletes records older than this (whole seconds, at least 1s). Defaults to no limit.
	MaxAge *Duration `json:"maxAge,omitempty"`
	// MaxEventCount keeps exactly this many newest records per partition (not per
	// stream, as seed 003's max_event_count was). Defaults to no limit.
	MaxEventCount *int64 `json:"maxEventCount,omitempty"`
	// MaxSizeBytes keeps the newest records whose stored payloads total at most this
	// many bytes per partition. Defaults to no limit.
	MaxSizeBytes *int64 `json:"maxSizeBytes,omitempty"`
	// ProtectConsumers keeps records a live group has not committed past, unless a
	// run is forced. Defaults to false.
	ProtectConsumers bool `json:"protectConsumers,omitempty"`
	// TombstoneRetention is how long compaction keeps a tombstone that is the latest
	// record of its key. Defaults to 1 day.
	TombstoneRetention *Duration `json:"tombstoneRetention,omitempty"`
}

// DeadLetter is the dead_letter_config section (keys: docs/retention.md).
type DeadLetter struct {
	// Backoff is the wait between a failed attempt and the next, whole seconds.
	// Defaults to none (the group's or queue's own).
	Backoff *Duration `json:"backoff,omitempty"`
	// Enabled turns dead-lettering on. Defaults to false.
	Enabled bool `json:"enabled,omitempty"`
	// MaxDeliveryAttempts before a record is dead-lettered (1 to 1000). Defaults to 0 (the group's setting).
	MaxDeliveryAttempts int `json:"maxDeliveryAttempts,omitempty"`
	// Stream, when set, is a stream that also receives a copy of each of the
	// groups' dead letters (with its provenance in headers, dlq_*), in the
	// dead-lettering transaction; one that does not exist gets nothing. Defaults to ""
	// (the dead letters are kept in the dead letter queue only).
	Stream string `json:"stream,omitempty"`
}

// Lifecycle is the lifecycle_config section (keys: docs/retention.md).
type Lifecycle struct {
	// ArchiveAfter is an idle time after which tooling may archive the stream. Defaults to never.
	ArchiveAfter *Duration `json:"archiveAfter,omitempty"`
	// DeleteAfter is an idle time after which tooling may delete the stream. Defaults to never.
	DeleteAfter *Duration `json:"deleteAfter,omitempty"`
	// ReadOnly makes the stream refuse appends (every path: the producer, streamd.append,
	// the event store, a plain INSERT) with streams.ErrInvalidArgument. Defaults to false.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Performance is the performance_config section (keys: docs/retention.md).
type Performance struct {
	// BatchSize is the preferred producer batch and fetch size (1 to 100000). Defaults to 0 (the client's).
	BatchSize int `json:"batchSize,omitempty"`
	// CompressionCodec is the codec of compressed Kafka fetches: gzip, snappy, lz4 or
	// zstd. Only with EnableCompression true. Defaults to "" (DefaultCompressionCodec).
	CompressionCodec string `json:"compressionCodec,omitempty"`
	// EnableCompression: true makes Kafka fetches of the stream return record batches
	// compressed with CompressionCodec; false returns them uncompressed. Kafka's
	// topic config compression.type reads and writes it (docs/kafka.md). Defaults to
	// nil: the Kafka listener's default (kafka.Config.Compression, uncompressed
	// unless set).
	EnableCompression *bool `json:"enableCompression,omitempty"`
}

// DefaultCompressionCodec is the codec of a stream whose performance_config enables
// compression without naming one (seed 003's example): lz4, cheap to compress and to
// decompress.
const DefaultCompressionCodec = "lz4"

// CompressionCodecs are the values performance_config.compressionCodec takes: the
// record batch codecs of Kafka.
var CompressionCodecs = []string{"gzip", "snappy", "lz4", "zstd"}

// AccessControl is the access_control_config section: the principals (API token
// principals, see streamd serve's --auth-token-file) allowed each action on the
// stream; "*" allows every authenticated principal. The principal "admin" may do
// everything on every stream. streamd serve's /v1/ API enforces it.
type AccessControl struct {
	// Admins may administer the stream (delete it, reset or delete its groups, replay
	// dead letters), and also read and write. Defaults to none listed.
	Admins []string `json:"admins,omitempty"`
	// Readers may fetch, describe the stream and its groups. Defaults to none listed.
	Readers []string `json:"readers,omitempty"`
	// Writers may append. Defaults to none listed.
	Writers []string `json:"writers,omitempty"`
}

// Allows reports whether principal may do action ("read", "write" or "admin").
func (a *AccessControl) Allows(principal, action string) bool {
	if a == nil {
		return false
	}
	has := func(list []string) bool { return slices.Contains(list, principal) || slices.Contains(list, "*") }
	if has(a.Admins) {
		return true
	}
	switch action {
	case "read":
		return has(a.Readers)
	case "write":
		return has(a.Writers)
	}
	return false
}

// ErrInvalidConfig: a configuration value that is not valid. The error is a
// *FieldError naming the field.
var ErrInvalidConfig = sqlerr.ErrInvalidStreamConfig

// FieldError says which field of a configuration is wrong and why. It matches
// ErrInvalidConfig.
type FieldError struct {
	Field   string // e.g. "retention_config.maxAge"
	Problem string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidConfig, e.Field, e.Problem)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidConfig }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

var (
	streamName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
	roleName   = regexp.MustCompile(`^[^\x00]{1,63}$`)
)

const maxSeconds = 1<<31 - 1 // the SQL columns are integer seconds

// Validate checks every section and returns a *FieldError for the first bad field.
func (c *Config) Validate() error {
	if c == nil {
		return nil
	}
	// Durations are stored in whole seconds: a fraction would be cut off silently (a
	// 500ms archiveAfter stored as 0, which the next Get and Set then refused).
	type field struct {
		name string
		v    *Duration
	}
	var durations []field
	if r := c.Retention; r != nil {
		durations = append(durations, field{"retention_config.maxAge", r.MaxAge},
			field{"retention_config.tombstoneRetention", r.TombstoneRetention})
	}
	if l := c.Lifecycle; l != nil {
		durations = append(durations, field{"lifecycle_config.archiveAfter", l.ArchiveAfter},
			field{"lifecycle_config.deleteAfter", l.DeleteAfter})
	}
	if d := c.DeadLetter; d != nil {
		durations = append(durations, field{"dead_letter_config.backoff", d.Backoff})
	}
	for _, d := range durations {
		if d.v != nil && time.Duration(*d.v)%time.Second != 0 {
			return fieldErr(d.name, "%s must be a whole number of seconds", time.Duration(*d.v))
		}
	}
	if r := c.Retention; r != nil {
		switch r.CleanupPolicy {
		case "", CleanupDelete, CleanupCompact, CleanupCompactDelete:
		default:
			return fieldErr("retention_config.cleanupPolicy", "%q is not delete, compact or compact,delete", r.CleanupPolicy)
		}
		if r.MaxAge != nil {
			if d := time.Duration(*r.MaxAge); d < time.Second || d/time.Second > maxSeconds {
				return fieldErr("retention_config.maxAge", "%s must be between 1s and 68 years", time.Duration(*r.MaxAge))
			}
		}
		if r.MaxEventCount != nil && (*r.MaxEventCount < 0 || *r.MaxEventCount > 1<<31-1) {
			return fieldErr("retention_config.maxEventCount", "%d must be between 0 and 2147483647", *r.MaxEventCount)
		}
		if r.MaxSizeBytes != nil && *r.MaxSizeBytes < 0 {
			return fieldErr("retention_config.maxSizeBytes", "%d must not be negative", *r.MaxSizeBytes)
		}
		if r.TombstoneRetention != nil {
			if d := time.Duration(*r.TombstoneRetention); d < 0 || d/time.Second > maxSeconds {
				return fieldErr("retention_config.tombstoneRetention", "%s must be between 0 and 68 years", d)
			}
		}
	}
	if d := c.DeadLetter; d != nil {
		if d.MaxDeliveryAttempts < 0 || d.MaxDeliveryAttempts > 1000 {
			return fieldErr("dead_letter_config.maxDeliveryAttempts", "%d must be between 1 and 1000", d.MaxDeliveryAttempts)
		}
		if d.Backoff != nil && (*d.Backoff < 0 || time.Duration(*d.Backoff)/time.Second > maxSeconds) {
			return fieldErr("dead_letter_config.backoff", "%s must be between 0 and 68 years", time.Duration(*d.Backoff))
		}
		if d.Stream != "" && (!streamName.MatchString(d.Stream) || d.Stream == "." || d.Stream == "..") {
			return fieldErr("dead_letter_config.stream", "%q is not a valid stream name", d.Stream)
		}
	}
	if l := c.Lifecycle; l != nil {
		if l.ArchiveAfter != nil && *l.ArchiveAfter <= 0 {
			return fieldErr("lifecycle_config.archiveAfter", "%s must be positive", time.Duration(*l.ArchiveAfter))
		}
		if l.DeleteAfter != nil && *l.DeleteAfter <= 0 {
			return fieldErr("lifecycle_config.deleteAfter", "%s must be positive", time.Duration(*l.DeleteAfter))
		}
	}
	if p := c.Performance; p != nil {
		if p.BatchSize < 0 || p.BatchSize > 100000 {
			return fieldErr("performance_config.batchSize", "%d must be between 1 and 100000", p.BatchSize)
		}
		if p.CompressionCodec != "" {
			if !slices.Contains(CompressionCodecs, p.CompressionCodec) {
				return fieldErr("performance_config.compressionCodec", "%q is not gzip, snappy, lz4 or zstd", p.CompressionCodec)
			}
			if p.EnableCompression == nil || !*p.EnableCompression {
				return fieldErr("performance_config.compressionCodec", "%q needs enableCompression true", p.CompressionCodec)
			}
		}
	}
	if a := c.AccessControl; a != nil {
		for _, l := range []struct {
			name string
			list []string
		}{{"admins", a.Admins}, {"readers", a.Readers}, {"writers", a.Writers}} {
			for i, r := range l.list {
				if !roleName.MatchString(r) {
					return fieldErr(fmt.Sprintf("access_control_config.%s[%d]", l.name, i), "%q is not a principal name", r)
				}
			}
		}
	}
	for k := range c.Tags {
		if k == "" {
			return fieldErr("tags", "a tag key must not be empty")
		}
	}
	return nil
}
