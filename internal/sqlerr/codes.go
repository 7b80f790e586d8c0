package sqlerr

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
)
