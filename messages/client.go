// Package messages is the visibility-timeout queue: ephemeral streams whose messages
// are received under a lease, settled by a receipt and dead-lettered after too many
// attempts. Everything lives in PostgreSQL (streamd.queues, streamd.queue_messages,
// streamd.message_groups; streamd.messages is seed 003's view of the messages); the
// SQL is in sql/functions/0300_messages.sql.
//
// Guarantees (docs/architecture.md says where each is enforced and tested):
//   - Q1: a received message is invisible to other receivers until its lease
//     (visibility timeout) ends, it is acked, nacked or termed, or its lease is
//     extended. Delivery is at-least-once. Settlements carry a receipt (offset and
//     lease token) checked in SQL: a stale receipt changes nothing (ErrLeaseLost).
//   - Q2: a message received MaxDeliveryAttempts times without an ack, or termed,
//     moves to its dead-letter queue in one transaction, keeping its provenance; it is
//     neither lost nor duplicated by the move.
//   - FIFO queues: messages of one group key are delivered one at a time, in send
//     order; groups are served round robin.
//
// Three ways to consume: Receive (a batch, with long polling), Work (a loop with
// bounded concurrency, lease extension and settlement from the handler's result), and
// plain SQL (streamd.queue_receive, streamd.queue_ack, ...).
package messages

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/wakeup"
)

// ClientConfig configures a Client. A nil *ClientConfig means the defaults.
type ClientConfig struct {
	// Logger receives the client's and its workers' log lines. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Now, when set, is the clock the SQL uses for visibility (tests). Defaults to
	// nil: the database's clock at each call (clock_timestamp(), after the FIFO
	// group locks the call waits for; not the transaction's start).
	Now func() time.Time
	// PollBackoffMax is the longest wait between two tries of a long poll. Defaults
	// to 500ms.
	PollBackoffMax time.Duration
	// PollBackoffMin is the first wait between two tries of a long poll; it doubles
	// up to PollBackoffMax. Defaults to 5ms.
	PollBackoffMin time.Duration
	// Registerer receives the queue metrics (streamd_queue_*). Defaults to nil: no
	// metrics.
	Registerer prometheus.Registerer
	// Wakeups, when set, wakes long polls early: a wakeup.Listener's Hub (the
	// tailer's wake-ups, fanned out by pg_notify) or one an in-process Broadcaster
	// feeds. The Client's own Sends notify it too, so they also wake the other readers
	// in the process that share it. Wake-ups are hints: a receiver always re-reads
	// through SQL. Defaults to nil: a Hub of the Client's own, so long polls are woken
	// by this Client's Sends and otherwise poll with backoff.
	Wakeups *wakeup.Hub
}

func (c *ClientConfig) validate() error {
	if c.PollBackoffMin < 0 {
		return invalid(ErrInvalidArgument, "ClientConfig.PollBackoffMin %v is negative", c.PollBackoffMin)
	}
	if c.PollBackoffMax < 0 {
		return invalid(ErrInvalidArgument, "ClientConfig.PollBackoffMax %v is negative", c.PollBackoffMax)
	}
	if c.PollBackoffMax != 0 && c.PollBackoffMin > c.PollBackoffMax {
		return invalid(ErrInvalidArgument, "ClientConfig.PollBackoffMin %v exceeds PollBackoffMax %v", c.PollBackoffMin, c.PollBackoffMax)
	}
	return nil
}

// Client sends, receives and settles messages and administers queues. It is safe for
// concurrent use.
type Client struct {
	pool    *pgxpool.Pool
	logger  *slog.Logger
	now     func() time.Time
	poll    wakeup.PollOpts // the long polls' backoff
	metrics *metrics
	hub     *wakeup.Hub
}

// NewClient returns a Client on pool. It fails when cfg is invalid or its metrics
// cannot be registered.
func NewClient(pool *pgxpool.Pool, cfg *ClientConfig) (*Client, error) {
	if cfg == nil {
		cfg = &ClientConfig{}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{
		pool:   pool,
		logger: cfg.Logger,
		now:    cfg.Now,
		poll:   wakeup.PollOpts{MinInterval: cfg.PollBackoffMin, MaxInterval: cfg.PollBackoffMax},
		hub:    cfg.Wakeups,
	}
	if c.hub == nil {
		c.hub = wakeup.NewHub()
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.poll.MinInterval == 0 {
		c.poll.MinInterval = 5 * time.Millisecond
	}
	if c.poll.MaxInterval == 0 {
		c.poll.MaxInterval = 500 * time.Millisecond
	}
	if c.poll.MinInterval > c.poll.MaxInterval {
		c.poll.MinInterval = c.poll.MaxInterval
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c.metrics = m
	return c, nil
}

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// sqlNow is the $now argument of the SQL functions: nil means the database's clock.
func (c *Client) sqlNow() any {
	if c.now == nil {
		return nil
	}
	return c.now()
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// ValidName reports whether name is a valid queue name: 1 to 249 characters of
// [A-Za-z0-9._-], not "." or "..".
func ValidName(name string) bool {
	return nameRE.MatchString(name) && name != "." && name != ".."
}

func checkName(name string) error {
	if !ValidName(name) {
		return invalid(ErrInvalidName, "queue name %q: use 1 to 249 characters of A-Z a-z 0-9 . _ -", name)
	}
	return nil
}

// QueueConfig is a queue's settings. The zero value is a standard queue with the
// defaults.
type QueueConfig struct {
	// DeadLetterQueue is the (standard) queue that receives this queue's messages
	// after MaxDeliveryAttempts deliveries, or when termed. Defaults to "": none;
	// messages are then redelivered until acked, and Term discards them.
	DeadLetterQueue string
	// FIFO makes the queue deliver messages of one group key one at a time, in order.
	// Every message then needs a GroupKey. It cannot change after creation. Defaults
	// to false.
	FIFO bool
	// MaxDeliveryAttempts is how many times a message is delivered before it moves to
	// the dead-letter queue. Defaults to 5.
	MaxDeliveryAttempts int
	// MaxPayloadBytes bounds a message's data plus headers (at most 64 MiB). Defaults
	// to 262144 (256 KiB).
	MaxPayloadBytes int
	// VisibilityTimeout is the lease a receive takes when it names none. Defaults to
	// 30s.
	VisibilityTimeout time.Duration
}

func (q *QueueConfig) validate(name string) error {
	switch {
	case q.MaxDeliveryAttempts < 0 || q.MaxDeliveryAttempts > math.MaxInt32:
		return invalid(ErrInvalidArgument, "queue %s: QueueConfig.MaxDeliveryAttempts %d must be between 1 and %d", name, q.MaxDeliveryAttempts, math.MaxInt32)
	case q.MaxPayloadBytes < 0 || q.MaxPayloadBytes > 64<<20:
		return invalid(ErrInvalidArgument, "queue %s: QueueConfig.MaxPayloadBytes %d must be between 1 and 67108864", name, q.MaxPayloadBytes)
	case q.VisibilityTimeout < 0:
		return invalid(ErrInvalidArgument, "queue %s: QueueConfig.VisibilityTimeout %v is negative", name, q.VisibilityTimeout)
	case q.VisibilityTimeout > 0 && q.VisibilityTimeout < time.Millisecond:
		return invalid(ErrInvalidArgument, "queue %s: QueueConfig.VisibilityTimeout %v is under 1ms", name, q.VisibilityTimeout)
	case q.DeadLetterQueue != "" && !ValidName(q.DeadLetterQueue):
		return invalid(ErrInvalidName, "queue %s: QueueConfig.DeadLetterQueue %q is not a valid queue name", name, q.DeadLetterQueue)
	case q.DeadLetterQueue == name:
		return invalid(ErrInvalidArgument, "queue %s: QueueConfig.DeadLetterQueue cannot be the queue itself", name)
	}
	return nil
}

// QueueInfo describes a queue.
type QueueInfo struct {
	Name                string        `json:"name"`
	FIFO                bool          `json:"fifo"`
	DeadLetterQueue     string        `json:"dead_letter_queue,omitempty"`
	MaxDeliveryAttempts int           `json:"max_delivery_attempts"`
	MaxPayloadBytes     int           `json:"max_payload_bytes"`
	VisibilityTimeout   time.Duration `json:"visibility_timeout"`
	CreatedAt           time.Time     `json:"created_at"`
}

// CreateQueue creates queue name, or updates an existing queue's settings (cfg nil
// means the defaults). The dead-letter queue must exist and be standard; a queue's
// FIFO setting cannot change. A change of the dead-letter queue or the maximum
// delivery attempts applies to the messages the queue holds too, except those sent
// with their own (OutgoingMessage.DeadLetterQueue, MaxDeliveryAttempts), which keep
// them. Errors: ErrInvalidName, ErrInvalidArgument, ErrQueueNotFound (for the
// dead-letter queue).
func (c *Client) CreateQueue(ctx context.Context, name string, cfg *QueueConfig) error {
	if err := checkName(name); err != nil {
		return err
	}
	q := QueueConfig{}
	if cfg != nil {
		q = *cfg
	}
	if err := q.validate(name); err != nil {
		return err
	}
	if q.MaxDeliveryAttempts == 0 {
		q.MaxDeliveryAttempts = 5
	}
	if q.MaxPayloadBytes == 0 {
		q.MaxPayloadBytes = 262144
	}
	if q.VisibilityTimeout == 0 {
		q.VisibilityTimeout = 30 * time.Second
	}
	var dlq *string
	if q.DeadLetterQueue != "" {
		dlq = &q.DeadLetterQueue
	}
	_, err := c.pool.Exec(ctx, "SELECT streamd.queue_create($1, $2, $3, $4, $5, $6)",
		name, q.FIFO, q.VisibilityTimeout.Milliseconds(), q.MaxDeliveryAttempts, dlq, q.MaxPayloadBytes)
	if err != nil {
		return fmt.Errorf("create queue %s: %w", name, sqlerr.Wrap(err))
	}
	return nil
}

// DeleteQueue deletes a queue and all its messages. ErrInvalidName for an invalid
// name; ErrQueueNotFound when it does not exist; ErrQueueInUse while another queue
// names it as its dead-letter queue.
func (c *Client) DeleteQueue(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	var existed bool
	if err := c.pool.QueryRow(ctx, "SELECT streamd.queue_delete($1)", name).Scan(&existed); err != nil {
		return fmt.Errorf("delete queue %s: %w", name, sqlerr.Wrap(err))
	}
	if !existed {
		return fmt.Errorf("delete queue %q: %w", name, ErrQueueNotFound)
	}
	return nil
}

const queueColumns = `queue_name, fifo, coalesce(dead_letter_queue, ''), max_delivery_attempts, max_payload_bytes,
	visibility_timeout_ms, created_at`

func scanQueue(r pgx.Row) (QueueInfo, error) {
	var q QueueInfo
	var vtMS int64
	err := r.Scan(&q.Name, &q.FIFO, &q.DeadLetterQueue, &q.MaxDeliveryAttempts, &q.MaxPayloadBytes, &vtMS, &q.CreatedAt)
	q.VisibilityTimeout = time.Duration(vtMS) * time.Millisecond
	return q, err
}

// GetQueue returns a queue's settings. Errors: ErrInvalidName, ErrQueueNotFound.
func (c *Client) GetQueue(ctx context.Context, name string) (*QueueInfo, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	q, err := scanQueue(c.pool.QueryRow(ctx, "SELECT "+queueColumns+" FROM streamd.queues WHERE queue_name = $1", name))
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("get queue %q: %w", name, ErrQueueNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get queue %s: %w", name, err)
	}
	return &q, nil
}

// ListQueues returns every queue, by name.
func (c *Client) ListQueues(ctx context.Context) ([]QueueInfo, error) {
	rows, err := c.pool.Query(ctx, "SELECT "+queueColumns+" FROM streamd.queues ORDER BY queue_name")
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueInfo, error) { return scanQueue(r) })
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return out, nil
}
