package consumergroup

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/wakeup"

	"github.com/streamd/streamd/streams"
)

// CommitMode says when a Consumer commits offsets.
type CommitMode int

const (
	// CommitAuto commits the offset after each batch the handler returned nil for,
	// asynchronously: the commits of the member's partitions are coalesced into one
	// statement at most every CommitInterval, and the next batch does not wait for
	// them (a revoke, a loss and a clean stop commit at once).
	CommitAuto CommitMode = iota
	// CommitManual commits only when the handler calls Batch.Commit (or the program
	// calls Consumer.Commit, e.g. from OnRevoked).
	CommitManual
	// CommitTransactional requires the handler to call Batch.CommitTx inside its own
	// transaction, so that its writes and the offset commit together (G4: effects in
	// the same database happen exactly once). A handler that returns nil without having
	// called CommitTx is treated as failed.
	CommitTransactional
)

// ResetPolicy is where a partition starts when the group has no committed offset.
type ResetPolicy int

const (
	// ResetEarliest starts at the log start.
	ResetEarliest ResetPolicy = iota
	// ResetLatest starts at the log end: only events appended from now on.
	ResetLatest
	// ResetByTime starts at the first event at or after Config.ResetTime.
	ResetByTime
)

// ErrorPolicy says what happens to a batch whose handler keeps failing after
// Config.MaxRetries retries.
type ErrorPolicy int

const (
	// ErrorBlock keeps retrying the batch (at RetryBackoffMax) and processes nothing
	// else of that partition until it succeeds: order is kept, progress stops.
	ErrorBlock ErrorPolicy = iota
	// ErrorDeadLetter retries the batch's events one at a time, moves each event that
	// still fails into the dead letter queue (streamd.dead_letter_queue) and goes on.
	ErrorDeadLetter
)

// Config.MaxRetries values besides counts: RetryForever retries a failed batch until
// it succeeds (as does any other negative value but NoRetries); NoRetries hands it to
// Config.OnHandlerError at its first failure (0 would mean the default, 5).
const (
	RetryForever = -1
	NoRetries    = math.MinInt
)

// A partition's fetch reads up to fetchBatches handler batches at once (at most
// fetchMaxRecords events, and at most the fetch's MaxBytes, 1 MiB), handed to the
// handler MaxBatchSize at a time: one statement per 500 events cost each event more
// server CPU than one per 5,000 (issue 21; bench/RESULTS.md, session 8), and Kafka's
// door reads up to 5,000 per partition too (kafka/01_fetch.go).
const (
	fetchBatches    = 10
	fetchMaxRecords = 5000
)

// fetchRecords is how many events one fetch of a partition reads at most: MaxBatchSize
// times fetchBatches, at most fetchMaxRecords, at least MaxBatchSize.
func (c Config) fetchRecords() int {
	if c.MaxBatchSize >= fetchMaxRecords/fetchBatches {
		return max(c.MaxBatchSize, fetchMaxRecords)
	}
	return fetchBatches * c.MaxBatchSize
}

// retries is MaxRetries as a count: 0 for NoRetries, negative for forever.
func (c Config) retries() int {
	if c.MaxRetries == NoRetries {
		return 0
	}
	return c.MaxRetries
}

// Membership names one membership of the group: the member id (Config.ConsumerID
// plus a suffix of its join) and the epoch that fences its commits. Batch.MemberID and
// Batch.MemberEpoch name the same, so hook calls and batches can be matched.
type Membership struct {
	MemberID    string
	MemberEpoch int64
}

// Hook is a rebalance callback: m is the membership the partitions were assigned to,
// revoked from or lost by. See Config.OnAssigned for the concurrency contract.
type Hook func(ctx context.Context, m Membership, partitions []int32)

// Config configures a Consumer. Stream and Group are required.
type Config struct {
	// AutoOffsetReset is where a partition without a committed offset starts.
	// Defaults to ResetEarliest.
	AutoOffsetReset ResetPolicy
	// CommitInterval is how long, in CommitAuto mode, the offsets of handled batches
	// may wait to be committed: they are committed asynchronously (the next batch
	// does not wait for the commit), and what all of the member's partitions handled
	// meanwhile goes out as one statement, at most once per interval (Kafka's
	// auto.commit.interval.ms, much shorter). A crash redelivers what was handled
	// but not committed yet (at-least-once, G4). A partition that is revoked or lost,
	// and a clean stop, commit at once, before OnRevoked. Defaults to 100ms.
	CommitInterval time.Duration
	// CommitMode says when offsets are committed. Defaults to CommitAuto.
	CommitMode CommitMode
	// ConsumerID prefixes the member id of each join (a random suffix makes every
	// membership distinct, so a fenced member can never be confused with its successor).
	// Defaults to the host name and process id.
	ConsumerID string
	// DrainTimeout bounds a clean stop (Run's ctx cancelled). The handler's ctx is not
	// Run's: the batches in flight go on with a live ctx, finish and commit (CommitTx
	// transactions included), no new batch starts, then OnRevoked runs and the member
	// leaves, so its partitions move to the other members at once. A handler still
	// running DrainTimeout after the stop began sees its ctx cancelled; its batch is
	// not committed and goes to the next owner. Heartbeats go on meanwhile, for at most
	// MaxPollInterval (keep DrainTimeout below it). Defaults to 10s.
	DrainTimeout time.Duration
	// FetchMaxWait is how long a fetch waits for new events on an idle partition
	// before looking again (it also bounds how fast an idle worker notices a revoke
	// when no wake-up arrives). Defaults to 500ms.
	FetchMaxWait time.Duration
	// Group is the consumer group id: 1 to 249 characters of [A-Za-z0-9._:-].
	// Required.
	Group string
	// HeartbeatInterval is the time between heartbeats. Defaults to SessionTimeout/3.
	HeartbeatInterval time.Duration
	// InstanceID enables static membership: a restart with the same instance id within
	// the session timeout takes the previous member's partitions back without a
	// rebalance, and a clean Run exit does not leave the group (the partitions wait
	// for the restart, up to the session timeout). It must be unique among the running
	// members: a member whose instance id another one took over stops, and its Run
	// returns ErrInstanceFenced. Defaults to "" (dynamic member).
	InstanceID string
	// Logger receives the consumer's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxBatchSize bounds the events per handler call. Defaults to the stream's
	// performance_config.batchSize, else 500.
	MaxBatchSize int
	// MaxPollInterval bounds one handler call (Kafka's max.poll.interval.ms): when a
	// handler runs longer, the member leaves the group so that others take its
	// partitions, cancels its handlers' context, reports OnLost, waits for them to
	// return, and joins again. It bounds each hook call too (see OnAssigned). At most
	// 2^31-1 milliseconds (about 24.8 days). Defaults to 5 minutes.
	MaxPollInterval time.Duration
	// MaxRetries is how many times a failed batch is retried (with exponential
	// backoff) before OnHandlerError applies; negative (RetryForever) means forever,
	// except NoRetries, which applies OnHandlerError at the first failure. Defaults to
	// the stream's dead_letter_config.maxDeliveryAttempts - 1, else 5 (0 means the
	// default).
	MaxRetries int
	// OnAssigned is called with partitions this member got, before their first batch.
	// Contract for all hooks: they are called from one goroutine, never concurrently
	// with each other, and never concurrently with a handler call of the partitions
	// they name (handlers of other partitions may be running). They must not call Run.
	// Each call names the membership (member id and epoch, as on Batch); a partition
	// assigned to a membership is later either revoked from it (OnRevoked) or lost by
	// it (OnLost), once. The member keeps heartbeating while a hook runs, so a hook may
	// take longer than SessionTimeout, but at most MaxPollInterval: its ctx ends then
	// and the heartbeats stop, and a hook still running gets the member expelled after
	// SessionTimeout (as a stuck handler does). Defaults to nil (no call).
	OnAssigned Hook
	// OnHandlerError says what happens to a batch that still fails after MaxRetries.
	// Defaults to ErrorDeadLetter when the stream's dead_letter_config.enabled is true,
	// else ErrorBlock.
	OnHandlerError ErrorPolicy
	// OnLost is called with partitions this member lost without a clean handover (its
	// session expired, it was fenced, or its handlers overran MaxPollInterval): another
	// member may already own them, commits for them fail with ErrFenced, and a batch
	// whose commit was refused will be processed again by the next owner (Kafka's
	// OnPartitionsLost: do not commit here, drop the partitions' state). Their handler
	// calls have returned. Defaults to nil.
	OnLost Hook
	// OnRevoked is called with partitions this member is handing over cleanly (a
	// rebalance, or Run's ctx cancelled: the drain), after their in-flight batches
	// finished and were committed (CommitAuto, CommitTx); the member still owns them
	// during the call, so CommitManual programs commit here with Consumer.Commit, and
	// the next owner starts after what was committed (Kafka's OnPartitionsRevoked).
	// A batch cut short by DrainTimeout is not committed and goes to the next owner.
	// Defaults to nil.
	OnRevoked Hook
	// RebalanceTimeout bounds how long this member may keep a partition that another
	// member waits for; past it the group expels this member. 1ms to 2^31-1
	// milliseconds (about 24.8 days). Defaults to MaxPollInterval (a batch may take
	// that long).
	RebalanceTimeout time.Duration
	// Registerer receives the consumer's metrics. Defaults to nil (no metrics).
	Registerer prometheus.Registerer
	// ResetTime is the start time for ResetByTime. Defaults to the zero time.
	ResetTime time.Time
	// RetryBackoff is the first wait before retrying a failed batch; it doubles up to
	// RetryBackoffMax. Defaults to the stream's dead_letter_config.backoff, else 100ms.
	RetryBackoff time.Duration
	// RetryBackoffMax caps the retry wait. Defaults to 10s.
	RetryBackoffMax time.Duration
	// SessionTimeout is how long the member stays in the group without a heartbeat
	// (G3). 10ms to 2^31-1 milliseconds (about 24.8 days). Defaults to 30s.
	SessionTimeout time.Duration
	// Stream is the stream to consume. Required.
	Stream string
	// Wakeups, when set, wakes an idle partition's fetch as soon as a commit to it is
	// seen (a wakeup.Listener's Hub: one shared LISTEN connection per process, fed by
	// streamd's tailer; or an in-process tailer's Hub). Polling stays on as the safety
	// net. Defaults to nil: idle partitions poll with backoff up to FetchMaxWait.
	Wakeups *wakeup.Hub

	// hooks are a test's reach into the Consumer (see testHooks); nil in a program.
	hooks *testHooks
}

func (c Config) withDefaults() Config {
	if c.ConsumerID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "consumer"
		}
		c.ConsumerID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = 100 * time.Millisecond
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = 500 * time.Millisecond
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 30 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.SessionTimeout / 3
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = 500
	}
	if c.MaxPollInterval == 0 {
		c.MaxPollInterval = 5 * time.Minute
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 5
	}
	if c.RebalanceTimeout == 0 {
		// As Kafka ties its rebalance timeout to max.poll.interval.ms: a handler
		// within MaxPollInterval must not get its member expelled because a
		// rebalance caught it mid-batch.
		c.RebalanceTimeout = c.MaxPollInterval
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = 100 * time.Millisecond
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = 10 * time.Second
	}
	return c
}

// maxTimeout is the longest SessionTimeout, RebalanceTimeout or MaxPollInterval: the
// first two travel to PostgreSQL as integer milliseconds (join_group), and
// RebalanceTimeout defaults to MaxPollInterval. About 24.8 days.
const maxTimeout = math.MaxInt32 * time.Millisecond

// validate names the first bad field. It runs after withDefaults, so defaulted values
// are checked too.
func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: consumergroup.Config.%s: %s", ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.AutoOffsetReset < ResetEarliest || c.AutoOffsetReset > ResetByTime:
		return bad("AutoOffsetReset", "unknown policy %d", c.AutoOffsetReset)
	case c.CommitInterval < 0:
		return bad("CommitInterval", "%v is negative", c.CommitInterval)
	case c.CommitMode < CommitAuto || c.CommitMode > CommitTransactional:
		return bad("CommitMode", "unknown mode %d", c.CommitMode)
	case len(c.ConsumerID) > 200:
		return bad("ConsumerID", "%d characters; at most 200", len(c.ConsumerID))
	case c.DrainTimeout < 0:
		return bad("DrainTimeout", "%v is negative", c.DrainTimeout)
	case c.FetchMaxWait < 0:
		return bad("FetchMaxWait", "%v is negative", c.FetchMaxWait)
	case !validGroupID(c.Group):
		return bad("Group", "%q: use 1 to 249 characters of A-Z a-z 0-9 . _ : -", c.Group)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.SessionTimeout:
		return bad("HeartbeatInterval", "%v must be positive and below SessionTimeout %v", c.HeartbeatInterval, c.SessionTimeout)
	case len(c.InstanceID) > 255:
		return bad("InstanceID", "%d characters; at most 255", len(c.InstanceID))
	case c.MaxBatchSize < 0:
		return bad("MaxBatchSize", "%d is negative", c.MaxBatchSize)
	case c.MaxPollInterval < 0 || c.MaxPollInterval > maxTimeout:
		return bad("MaxPollInterval", "%v: use a positive duration of at most %v", c.MaxPollInterval, maxTimeout)
	case c.OnHandlerError < ErrorBlock || c.OnHandlerError > ErrorDeadLetter:
		return bad("OnHandlerError", "unknown policy %d", c.OnHandlerError)
	case c.RebalanceTimeout < time.Millisecond || c.RebalanceTimeout > maxTimeout:
		return bad("RebalanceTimeout", "%v: use 1ms to %v", c.RebalanceTimeout, maxTimeout)
	case c.RetryBackoff < 0:
		return bad("RetryBackoff", "%v is negative", c.RetryBackoff)
	case c.RetryBackoffMax < c.RetryBackoff:
		return bad("RetryBackoffMax", "%v is below RetryBackoff %v", c.RetryBackoffMax, c.RetryBackoff)
	case c.SessionTimeout < 10*time.Millisecond || c.SessionTimeout > maxTimeout:
		return bad("SessionTimeout", "%v: use 10ms to %v", c.SessionTimeout, maxTimeout)
	case !streams.ValidName(c.Stream):
		return bad("Stream", "%q is not a valid stream name", c.Stream)
	}
	return nil
}

// validGroupID is streamd.cg_valid_group_id.
func validGroupID(g string) bool {
	if len(g) < 1 || len(g) > 249 || g == "." || g == ".." {
		return false
	}
	for _, r := range g {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}
