package messages

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/wakeup"
)

// Receipt names one delivery of a message: the message and the lease token its
// receive got. Settlements take a Receipt; once the message is received again, the
// old receipt is stale and settles nothing (ErrLeaseLost).
type Receipt struct {
	Queue      string   `json:"queue"`
	Offset     int64    `json:"offset"`
	LeaseToken [16]byte `json:"lease_token"`
	MessageID  string   `json:"message_id"`
	// Attempt is this delivery's number (1 for the first).
	Attempt int `json:"attempt"`
}

// String is the receipt as queue/offset/token.
func (r Receipt) String() string {
	return fmt.Sprintf("%s/%d/%s", r.Queue, r.Offset, hex.EncodeToString(r.LeaseToken[:]))
}

// Origin is a dead letter's provenance.
type Origin struct {
	// Queue is the queue the message was dead-lettered from.
	Queue string `json:"queue"`
	// Offset is its offset there.
	Offset int64 `json:"offset"`
	// Attempts is how many times it had been delivered there.
	Attempts int `json:"attempts"`
	// DeadLetteredAt is when it moved.
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
}

// Message is a received (or peeked) message.
type Message struct {
	Queue     string          `json:"queue"`
	Offset    int64           `json:"offset"`
	MessageID string          `json:"message_id"`
	Data      json.RawMessage `json:"data,omitempty"`
	// Bytes is the payload of a binary message (OutgoingMessage.Bytes); Data is nil
	// then.
	Bytes    []byte            `json:"data_bytes,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	GroupKey string            `json:"group_key,omitempty"`
	// EnqueuedAt is when the message was first sent (kept across dead-lettering).
	EnqueuedAt time.Time `json:"enqueued_at"`
	// VisibleAt is when the message is (again) visible: the lease's end for a
	// received message.
	VisibleAt time.Time `json:"visible_at"`
	// DeliveryAttempts counts deliveries, this one included.
	DeliveryAttempts    int `json:"delivery_attempts"`
	MaxDeliveryAttempts int `json:"max_delivery_attempts"`
	// LastError is the error of the last nack or term, if any.
	LastError string `json:"last_error,omitempty"`
	// Origin is set on dead letters.
	Origin *Origin `json:"origin,omitempty"`
	// Receipt settles this delivery (zero for a peeked message).
	Receipt Receipt `json:"receipt"`
}

// ReceiveOpts are Receive's per-call knobs. A nil *ReceiveOpts means the defaults.
type ReceiveOpts struct {
	// Max is the most messages to receive. Defaults to 1; at most 10000.
	Max int
	// VisibilityTimeout is the lease. Defaults to the queue's.
	VisibilityTimeout time.Duration
	// Wait is how long to wait for a message when none is visible (long polling).
	// Defaults to 0: return at once.
	Wait time.Duration
	// Ack are receipts of this queue to ack in the same round trip and transaction
	// as the receive, before it: a consumer that acks each batch as it asks for the
	// next saves a statement, a commit and a round trip per batch. Receipts that were
	// stale come back as a *LeaseLostError (matching ErrLeaseLost) returned together
	// with the received messages, which are leased either way. With Wait, the acks go
	// with the first try. Defaults to none.
	Ack []Receipt
}

// Receive leases up to opts.Max visible messages of queue (Q1): each is invisible to
// other receivers until its lease ends, and gets delivery attempt +1 and a new
// receipt. A message that already used up its attempts moves to the dead-letter queue
// instead (Q2). With opts.Wait, an empty queue is polled (with backoff, and at once on
// a wake-up) until a message arrives or the wait ends; then Receive returns no
// messages and no error. It returns ctx's error when ctx ends first, except that a
// receive statement already sent runs to its end (within receiveStatementTimeout):
// its messages are returned, leased, with a nil error. Cancelling the statement
// instead would race with the database: a cancel that arrives before the server reads
// the statement is dropped, and the messages were then leased to nobody until their
// visibility timeout (a Work that stopped left up to Concurrency messages so, seen in
// BenchmarkQueueWorker as 30 s stalls).
//
// Errors: ErrQueueNotFound, ErrInvalidName, ErrInvalidArgument.
func (c *Client) Receive(ctx context.Context, queue string, opts *ReceiveOpts) ([]*Message, error) {
	o := ReceiveOpts{}
	if opts != nil {
		o = *opts
	}
	if err := checkName(queue); err != nil {
		return nil, err
	}
	switch {
	case o.Max < 0 || o.Max > 10000:
		return nil, invalid(ErrInvalidArgument, "queue %s: ReceiveOpts.Max %d must be between 1 and 10000", queue, o.Max)
	case o.VisibilityTimeout < 0:
		return nil, invalid(ErrInvalidArgument, "queue %s: ReceiveOpts.VisibilityTimeout %v is negative", queue, o.VisibilityTimeout)
	case o.VisibilityTimeout > 0 && o.VisibilityTimeout < time.Millisecond:
		return nil, invalid(ErrInvalidArgument, "queue %s: ReceiveOpts.VisibilityTimeout %v is under 1ms", queue, o.VisibilityTimeout)
	case o.Wait < 0:
		return nil, invalid(ErrInvalidArgument, "queue %s: ReceiveOpts.Wait %v is negative", queue, o.Wait)
	}
	for _, r := range o.Ack {
		if r.Queue != queue {
			return nil, invalid(ErrInvalidArgument, "queue %s: ReceiveOpts.Ack holds a receipt of queue %s", queue, r.Queue)
		}
		if r.Offset < 0 {
			return nil, invalid(ErrInvalidArgument, "queue %s: ReceiveOpts.Ack holds a receipt with negative offset %d", queue, r.Offset)
		}
	}
	if o.Max == 0 {
		o.Max = 1
	}
	if o.Wait == 0 {
		return c.receiveOnce(ctx, queue, o)
	}

	// Subscribe before the first try, so that a wake-up between an empty try and the
	// wait is not lost.
	sub := c.hub.Subscribe(wakeup.KindQueue, queue)
	defer sub.Close()
	var (
		msgs   []*Message
		tryErr error
		ackErr error // the first try's stale acks, if it found no message
	)
	err := wakeup.Poll(ctx, sub, time.Now().Add(o.Wait), &c.poll, func() (bool, error) {
		msgs, tryErr = c.receiveOnce(ctx, queue, o)
		if len(o.Ack) > 0 && errors.Is(tryErr, ErrLeaseLost) {
			ackErr, tryErr = tryErr, nil
		}
		o.Ack = nil
		return tryErr != nil || len(msgs) > 0, nil
	})
	if tryErr != nil || len(msgs) > 0 {
		return msgs, cmp.Or(tryErr, ackErr)
	}
	return nil, cmp.Or(ackErr, err) // err: ctx's, when it ended during the wait
}

// receiveStatementTimeout bounds a receive statement that runs on after its caller's
// ctx ended. A receive never waits for a lock (SKIP LOCKED), so only a sick database
// takes this long.
const receiveStatementTimeout = 30 * time.Second

func (c *Client) receiveOnce(ctx context.Context, queue string, o ReceiveOpts) ([]*Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The connection is taken under the caller's ctx (waiting for one sends nothing,
	// so giving up is safe: a stopping Work with every connection busy does not wait
	// for receiveStatementTimeout); the statement then runs under its own.
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("receive from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), receiveStatementTimeout)
	defer cancel()
	var vt *int64
	if o.VisibilityTimeout > 0 {
		ms := o.VisibilityTimeout.Milliseconds()
		vt = &ms
	}
	const receiveSQL = `SELECT "offset", message_id, data, metadata, enqueued_at, visibility_timeout,
			delivery_attempts, max_delivery_attempts, lease_token, group_key, last_error,
			origin_stream, origin_offset, origin_attempts, dead_lettered_at, data_bytes
		FROM streamd.queue_receive($1, $2, $3, $4)`
	var (
		rows   pgx.Rows
		ackErr error
		br     pgx.BatchResults
		stale  map[receiptKey]bool // receipts of o.Ack the ack did not settle
	)
	if len(o.Ack) == 0 {
		out, ok, derr := c.receiveDirect(ctx, conn, queue, o.Max, vt)
		if derr != nil {
			return nil, derr
		}
		if ok {
			sort.Slice(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
			c.metrics.add(c.metrics.received, queue, len(out))
			return out, nil
		}
		// Declined (no standard queue of the name, or a message due for its
		// dead-letter queue): queue_receive raises the typed error or does it.
		rows, err = conn.Query(ctx, receiveSQL, queue, o.Max, vt, c.sqlNow())
	} else {
		// One round trip: the ack and the receive are sent together and run in one
		// implicit transaction (one Sync), so a failed receive undoes the ack too.
		offs, toks := receiptArrays(o.Ack)
		b := &pgx.Batch{}
		b.Queue(ackSQL, queue, offs, toks, c.sqlNow(), len(o.Ack))
		b.Queue(receiveSQL, queue, o.Max, vt, c.sqlNow())
		br = conn.SendBatch(ctx, b)
		defer br.Close()
		missed, qerr := readAck(br.QueryRow(), o.Ack)
		if qerr != nil {
			return nil, fmt.Errorf("ack on queue %s: %w", queue, sqlerr.Wrap(qerr))
		}
		stale = missed
		rows, err = br.Query()
	}
	if err != nil {
		return nil, fmt.Errorf("receive from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	defer rows.Close()
	var out []*Message
	for rows.Next() {
		m, err := scanMessage(rows, queue, true)
		if err != nil {
			return nil, fmt.Errorf("receive from queue %s: %w", queue, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("receive from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	if br != nil {
		// The batch's implicit transaction commits at its Sync: the acks and the
		// leases are done only once Close has read the commit's result.
		if err := br.Close(); err != nil {
			return nil, fmt.Errorf("receive from queue %s: %w", queue, sqlerr.Wrap(err))
		}
		c.metrics.add(c.metrics.acked, queue, settledCount(o.Ack, stale))
		ackErr = c.lost(ctx, queue, o.Ack, func(k receiptKey) bool { return !stale[k] })
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	c.metrics.add(c.metrics.received, queue, len(out))
	return out, ackErr
}

type scanner interface{ Scan(dest ...any) error }

func scanMessage(r scanner, queue string, leased bool) (*Message, error) {
	var (
		m         = &Message{Queue: queue}
		meta      []byte
		token     *[16]byte
		group     *string
		lastErr   *string
		originQ   *string
		originOff *int64
		originAtt *int32
		deadAt    *time.Time
		attempts  int32
		maxAtt    int32
	)
	// data into a []byte: the database's jsonb is valid JSON, and pgx scans a
	// json.RawMessage through json.Unmarshal, which parsed every payload again (8% of
	// a receiving client's CPU in BenchmarkQueueThroughput).
	var data []byte
	err := r.Scan(&m.Offset, &m.MessageID, &data, &meta, &m.EnqueuedAt, &m.VisibleAt, &attempts, &maxAtt,
		&token, &group, &lastErr, &originQ, &originOff, &originAtt, &deadAt, &m.Bytes)
	if err != nil {
		return nil, err
	}
	if data != nil {
		m.Data = data
	}
	m.DeliveryAttempts, m.MaxDeliveryAttempts = int(attempts), int(maxAtt)
	if len(meta) > 0 && string(meta) != "null" {
		if err := json.Unmarshal(meta, &m.Headers); err != nil {
			// Metadata written by another client need not be a map of strings.
			m.Headers = map[string]string{"metadata": string(meta)}
		}
	}
	if group != nil {
		m.GroupKey = *group
	}
	if lastErr != nil {
		m.LastError = *lastErr
	}
	if originQ != nil {
		m.Origin = &Origin{Queue: *originQ}
		if originOff != nil {
			m.Origin.Offset = *originOff
		}
		if originAtt != nil {
			m.Origin.Attempts = int(*originAtt)
		}
		if deadAt != nil {
			m.Origin.DeadLetteredAt = *deadAt
		}
	}
	if leased && token != nil {
		m.Receipt = Receipt{Queue: queue, Offset: m.Offset, LeaseToken: *token, MessageID: m.MessageID, Attempt: m.DeliveryAttempts}
	}
	return m, nil
}
