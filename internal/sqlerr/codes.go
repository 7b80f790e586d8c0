package sqlerr

import "errors"

// Every SQLSTATE that streamd's SQL functions raise. Class SD is streamd's own.
// Log (sql/functions/0100_log.sql): SD0xx. Consumer groups: SD1xx. Queues: SD2xx.
// Retention and configuration: SD3xx. Event sourcing: SD4xx.
const (
	StreamNotFound    = "SD001"
	PartitionNotFound = "SD002"
	InvalidName       = "SD003"
	PayloadTooLarge   = "SD004"
	InvalidArgument   = "SD005"
	PartitionDecrease = "SD006"
	OffsetOutOfRange  = "SD007"
	// Idempotent producers (sql/functions/0120_log_producers.sql).
	OutOfOrderSequence = "SD008"
	ProducerFenced     = "SD009"
	DuplicateSequence  = "SD010"

	// Consumer groups (sql/functions/0200_consumer_groups*.sql).
	Fenced             = "SD101" // raised as one of FencedSession, FencedPartition, FencedEpoch
	GroupNotFound      = "SD102"
	InvalidGroupID     = "SD103"
	GroupNotEmpty      = "SD104"
	GroupInvalidArg    = "SD105"
	DeadLetterNotFound = "SD106"
	AlreadyCommitted   = "SD107"
	FencedSession      = "SD108"
	FencedPartition    = "SD109"
	FencedEpoch        = "SD110"

	// Kafka classic-protocol groups (sql/functions/0220_kafka_groups.sql).
	UnknownMember            = "SD150"
	InconsistentProtocol     = "SD151"
	FencedInstance           = "SD152"
	IllegalGeneration        = "SD153"
	ClassicRebalanceUnderway = "SD154"

	// Queues (sql/functions/0300_messages.sql).
	QueueNotFound        = "SD201"
	InvalidQueueName     = "SD202"
	QueuePayloadTooLarge = "SD203"
	QueueInvalidArgument = "SD204"
	QueueInUse           = "SD205"

	// Retention and stream configuration (sql/functions/0400_retention.sql,
	// 0410_stream_config.sql).
	InvalidStreamConfig      = "SD301"
	RetentionInvalidArgument = "SD302"
	RetentionPolicyNotFound  = "SD303"

	// Event sourcing (sql/functions/1000_eventstore.sql).
	VersionMismatch  = "SD401"
	SessionNotOpen   = "SD402"
	SessionExpired   = "SD403"
	SessionHeld      = "SD404"
	NotVersioned     = "SD405"
	UnknownEventType = "SD406"

	// JSON that does not parse (PostgreSQL's invalid_text_representation, raised by
	// the jsonb input function).
	InvalidJSON = "22P02"
	// JSONUnsupportedEscape is PostgreSQL's untranslatable_character, which jsonb's
	// input function raises for \u0000.
	JSONUnsupportedEscape = "22P05"
	// InvalidEncoding is PostgreSQL's character_not_in_repertoire: text (a JSON
	// payload sent as text) that is not valid in the database's encoding.
	InvalidEncoding = "22021"
	// ProgramLimitExceeded is PostgreSQL's program_limit_exceeded: a value over one of
	// its size limits as it is stored (an index row over about 2.7 kB, such as a long
	// key of a versioned stream; an array or a jsonb over its largest).
	ProgramLimitExceeded = "54000"

	// LockNotAvailable is PostgreSQL's lock_not_available: a lock wait cut short by
	// lock_timeout.
	LockNotAvailable = "55P03"
)

// The sentinels of the codes above. The public packages export each under their own
// name (streams.ErrStreamNotFound is sqlerr.ErrStreamNotFound) and document it there; they
// are declared here so that the one table below can name them without an import of
// the public packages (which import this one) and without registration at init.
var (
	// The log (package streams).
	ErrStreamNotFound     = errors.New("stream not found")
	ErrPartitionNotFound  = errors.New("partition not found")
	ErrInvalidName        = errors.New("invalid name")
	ErrPayloadTooLarge    = errors.New("payload too large")
	ErrInvalidJSON        = errors.New("invalid JSON")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrPartitionsDecrease = errors.New("partition count cannot decrease")
	ErrOffsetOutOfRange   = errors.New("offset out of range")
	ErrOutOfOrderSequence = errors.New("out of order sequence")
	ErrProducerFenced     = errors.New("producer fenced")
	ErrDuplicateSequence  = errors.New("duplicate sequence")

	// Consumer groups (package consumergroup).
	ErrFenced               = errors.New("fenced")
	ErrGroupNotFound        = errors.New("group not found")
	ErrInvalidGroupID       = errors.New("invalid group id")
	ErrGroupNotEmpty        = errors.New("group has live members")
	ErrGroupInvalidArgument = errors.New("invalid argument")
	ErrDeadLetterNotFound   = errors.New("dead letter not found")
	ErrAlreadyCommitted     = errors.New("batch already committed")
	ErrInstanceFenced       = errors.New("instance id taken over by another member")

	// Kafka classic groups (package consumergroup, classic.go).
	ErrUnknownMember             = errors.New("unknown member")
	ErrIllegalGeneration         = errors.New("illegal generation")
	ErrRebalanceInProgress       = errors.New("rebalance in progress")
	ErrInconsistentGroupProtocol = errors.New("inconsistent group protocol")

	// Queues (package messages).
	ErrQueueNotFound        = errors.New("queue not found")
	ErrInvalidQueueName     = errors.New("invalid queue name")
	ErrQueuePayloadTooLarge = errors.New("payload too large")
	ErrQueueInvalidArgument = errors.New("invalid argument")
	ErrQueueInUse           = errors.New("queue in use")

	// Retention and stream configuration (packages retention, streamconfig).
	ErrRetentionInvalidArgument = errors.New("invalid retention argument")
	ErrNoRetentionPolicy        = errors.New("no retention policy")
	ErrInvalidStreamConfig      = errors.New("invalid stream configuration")

	// ErrInvalidText is text PostgreSQL cannot store (a NUL byte, bytes not valid
	// UTF-8), refused as it binds: it is every package's invalid argument (it matches
	// streams', consumergroup's, messages' and retention's ErrInvalidArgument).
	ErrInvalidText error = invalidInput("invalid argument: text holds a NUL byte or is not valid UTF-8")
	// ErrValueTooLarge is a value over one of PostgreSQL's size limits (an index row's,
	// an array's, a jsonb's), refused as it is stored: the caller's input, every
	// package's invalid argument, as ErrInvalidText is.
	ErrValueTooLarge error = invalidInput("invalid argument: a value is over PostgreSQL's size limit for it")

	// Event sourcing (package eventstore).
	ErrVersionMismatch  = errors.New("version mismatch")
	ErrSessionNotOpen   = errors.New("key not open in this session")
	ErrSessionExpired   = errors.New("session expired")
	ErrSessionHeld      = errors.New("key held by another session")
	ErrNotVersioned     = errors.New("stream does not keep key versions")
	ErrUnknownEventType = errors.New("unknown event type")
)

// sentinels is the one map from SQLSTATE to sentinel.
var sentinels = map[string]error{
	StreamNotFound:     ErrStreamNotFound,
	PartitionNotFound:  ErrPartitionNotFound,
	InvalidName:        ErrInvalidName,
	PayloadTooLarge:    ErrPayloadTooLarge,
	InvalidArgument:    ErrInvalidArgument,
	PartitionDecrease:  ErrPartitionsDecrease,
	OffsetOutOfRange:   ErrOffsetOutOfRange,
	OutOfOrderSequence: ErrOutOfOrderSequence,
	ProducerFenced:     ErrProducerFenced,
	DuplicateSequence:  ErrDuplicateSequence,
	InvalidJSON:        ErrInvalidJSON,
	// A NUL byte or bytes not valid UTF-8 in a text bind parameter (a name, an id, a
	// filter) or, for 22P05, a \u0000 escape inside jsonb: the client's input.
	InvalidEncoding:       ErrInvalidText,
	JSONUnsupportedEscape: ErrInvalidJSON,
	ProgramLimitExceeded:  ErrValueTooLarge,

	Fenced:             ErrFenced,
	FencedSession:      ErrFenced,
	FencedPartition:    ErrFenced,
	FencedEpoch:        ErrFenced,
	GroupNotFound:      ErrGroupNotFound,
	InvalidGroupID:     ErrInvalidGroupID,
	GroupNotEmpty:      ErrGroupNotEmpty,
	GroupInvalidArg:    ErrGroupInvalidArgument,
	DeadLetterNotFound: ErrDeadLetterNotFound,
	AlreadyCommitted:   ErrAlreadyCommitted,

	UnknownMember:            ErrUnknownMember,
	InconsistentProtocol:     ErrInconsistentGroupProtocol,
	FencedInstance:           ErrInstanceFenced,
	IllegalGeneration:        ErrIllegalGeneration,
	ClassicRebalanceUnderway: ErrRebalanceInProgress,

	QueueNotFound:        ErrQueueNotFound,
	InvalidQueueName:     ErrInvalidQueueName,
	QueuePayloadTooLarge: ErrQueuePayloadTooLarge,
	QueueInvalidArgument: ErrQueueInvalidArgument,
	QueueInUse:           ErrQueueInUse,

	InvalidStreamConfig:      ErrInvalidStreamConfig,
	RetentionInvalidArgument: ErrRetentionInvalidArgument,
	RetentionPolicyNotFound:  ErrNoRetentionPolicy,

	VersionMismatch:  ErrVersionMismatch,
	SessionNotOpen:   ErrSessionNotOpen,
	SessionExpired:   ErrSessionExpired,
	SessionHeld:      ErrSessionHeld,
	NotVersioned:     ErrNotVersioned,
	UnknownEventType: ErrUnknownEventType,
}

// Codes returns a copy of the map from SQLSTATE to sentinel (for tests and docs).
func Codes() map[string]error {
	out := make(map[string]error, len(sentinels))
	for k, v := range sentinels {
		out[k] = v
	}
	return out
}

// invalidInput is ErrInvalidText and ErrValueTooLarge: input PostgreSQL refused, a
// condition that every package names its own way (its ErrInvalidArgument).
type invalidInput string

func (e invalidInput) Error() string { return string(e) }

func (invalidInput) Is(target error) bool {
	switch target {
	case ErrInvalidArgument, ErrGroupInvalidArgument, ErrQueueInvalidArgument, ErrRetentionInvalidArgument:
		return true
	}
	return false
}
