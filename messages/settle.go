package messages

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// Settlement: every call names messages by Receipt and checks the lease token in SQL.
// Receipts whose message was received again since, settled, purged or moved are
// refused with a *LeaseLostError (matching ErrLeaseLost) that lists them; the other
// receipts of the call are settled. Receipts may name several queues: each queue's are
// settled by a statement of their own, in queue-name order, so an error on one queue
// (it was deleted, the connection broke) leaves the queues before it settled and those
// after it not. AckTx in one transaction is all or nothing; for the others, settle one
// queue per call when that matters. A receipt named twice counts once. A receipt with
// a negative offset is refused with ErrInvalidArgument, and then nothing is settled.

// Ack deletes the messages of receipts: they are done. A receipt whose lease expired
// but whose message nobody received since still acks.
func (c *Client) Ack(ctx context.Context, receipts ...Receipt) error {
	return c.AckTx(ctx, c.pool, receipts...)
}

// AckTx is Ack inside the caller's transaction tx, so that the handler's own writes
// and the ack commit together (the message is then processed exactly once). The
// message row stays locked until tx ends.
func (c *Client) AckTx(ctx context.Context, tx streams.DBTX, receipts ...Receipt) error {
	return forEachQueue(receipts, func(queue string, rs []Receipt) error {
		offs, toks := receiptArrays(rs)
		missed, err := readAck(tx.QueryRow(ctx, ackSQL, queue, offs, toks, c.sqlNow(), len(rs)), rs)
		if err != nil {
			return fmt.Errorf("ack on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		c.metrics.add(c.metrics.acked, queue, settledCount(rs, missed))
		noteSelfSettled(ctx, queue, rs)
		return c.lost(ctx, queue, rs, func(k receiptKey) bool { return !missed[k] })
	})
}

// ackSQL acks receipts ($2, $3: offsets and tokens of queue $1; $5: how many) and
// returns one row: how many it settled and, only when that is fewer than $5, the
// settled receipts as two arrays (usually NULL). streamd.queue_ack returns a row per
// message; reading them back cost a batch of 100 as much as the rows themselves
// (session 8 sent them back as an EXCEPT of what the client sent, a set operation of
// 200 rows on the server: 15% of an ack's server CPU).
const ackSQL = `SELECT count(*), CASE WHEN count(*) < $5 THEN array_agg(a."offset") END,
	       CASE WHEN count(*) < $5 THEN array_agg(a.lease_token) END
	FROM streamd.queue_ack($1, $2, $3, $4) a`

// readAck reads ackSQL's row and returns the receipts of rs it did not settle.
func readAck(row interface{ Scan(...any) error }, rs []Receipt) (map[receiptKey]bool, error) {
	var (
		n    int64
		offs []int64
		toks [][16]byte
	)
	if err := row.Scan(&n, &offs, &toks); err != nil {
		return nil, err
	}
	missed := map[receiptKey]bool{}
	if n >= int64(len(rs)) {
		return missed, nil
	}
	settled := make(map[receiptKey]bool, len(offs))
	for i := range offs {
		if i < len(toks) {
			settled[receiptKey{offs[i], toks[i]}] = true
		}
	}
	for _, r := range rs {
		if k := (receiptKey{r.Offset, r.LeaseToken}); !settled[k] {
			missed[k] = true
		}
	}
	return missed, nil
}

// NackOpts are Nack's per-call knobs. A nil *NackOpts means the defaults.
type NackOpts struct {
	// Delay keeps the message invisible for this long before its next delivery.
	// Defaults to 0: visible at once.
	Delay time.Duration
	// Backoff, when set, is a schedule: each receipt's message waits
	// Backoff(receipt.Attempt) (for example ExponentialBackoff(time.Second,
	// time.Minute)), so the receipts of one call may wait differently. It replaces
	// Delay. Defaults to nil: Delay.
	Backoff func(attempt int) time.Duration
	// Error is recorded as the message's last error (kept when it is dead-lettered).
	// Defaults to "".
	Error string
}

// Nack gives messages back: each becomes visible again after opts.Delay, and its
// receipt is spent. A message that has used up its delivery attempts and has a
// dead-letter queue moves there now (Q2). Errors: ErrInvalidArgument for a negative
// delay (from Delay or Backoff) or an Error that PostgreSQL's text cannot hold
// (invalid UTF-8, a NUL byte; nothing is nacked then), ErrLeaseLost.
func (c *Client) Nack(ctx context.Context, opts *NackOpts, receipts ...Receipt) error {
	o := NackOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Delay < 0 {
		return invalid(ErrInvalidArgument, "NackOpts.Delay %v is negative", o.Delay)
	}
	if why := pgtext.TextProblem(o.Error); why != "" {
		return invalid(ErrInvalidArgument, "NackOpts.Error: %s", why)
	}
	delayOf := func(Receipt) time.Duration { return o.Delay }
	if o.Backoff != nil {
		delayOf = func(r Receipt) time.Duration { return o.Backoff(r.Attempt) }
		for _, r := range receipts {
			if d := delayOf(r); d < 0 {
				return invalid(ErrInvalidArgument, "NackOpts.Backoff(%d) = %v is negative", r.Attempt, d)
			}
		}
	}
	return forEachQueue(receipts, func(queue string, rs []Receipt) error {
		offs, toks := receiptArrays(rs)
		delays := make([]int64, len(rs))
		errs := make([]*string, len(rs))
		for i := range rs {
			delays[i] = delayOf(rs[i]).Milliseconds()
			if o.Error != "" {
				errs[i] = &o.Error
			}
		}
		rows, err := c.pool.Query(ctx, `SELECT "offset", lease_token, dead_lettered FROM streamd.queue_nack($1, $2, $3, $4, $5, $6)`,
			queue, offs, toks, delays, errs, c.sqlNow())
		if err != nil {
			return fmt.Errorf("nack on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		done := map[receiptKey]bool{}
		dead := 0
		for rows.Next() {
			var k receiptKey
			var dl bool
			if err := rows.Scan(&k.offset, &k.token, &dl); err != nil {
				rows.Close()
				return fmt.Errorf("nack on queue %s: %w", queue, err)
			}
			if done[k] {
				continue // (the SQL settles a receipt once; count it once whatever it returns)
			}
			done[k] = true
			if dl {
				dead++
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("nack on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		c.metrics.add(c.metrics.nacked, queue, len(done)-dead)
		c.metrics.add(c.metrics.deadLettered, queue, dead)
		noteSelfSettled(ctx, queue, rs)
		return c.lost(ctx, queue, rs, func(k receiptKey) bool { return done[k] })
	})
}

// Release gives messages back without spending a delivery attempt: each becomes
// visible again at once, in its old place, its attempt count back where it was before
// this delivery and its last error kept; it is never dead-lettered. For a consumer
// that will not handle messages it received (it is stopping), and for handlers it
// interrupted: those were no failed delivery, and a Nack for each would let enough
// restarts dead-letter a good message. A handler that failed nacks. Errors:
// ErrLeaseLost.
func (c *Client) Release(ctx context.Context, receipts ...Receipt) error {
	return forEachQueue(receipts, func(queue string, rs []Receipt) error {
		offs, toks := receiptArrays(rs)
		rows, err := c.pool.Query(ctx, `SELECT "offset", lease_token FROM streamd.queue_release($1, $2, $3, $4)`,
			queue, offs, toks, c.sqlNow())
		if err != nil {
			return fmt.Errorf("release on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		done, err := collectOffsets(rows)
		if err != nil {
			return fmt.Errorf("release on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		c.metrics.add(c.metrics.released, queue, len(done))
		noteSelfSettled(ctx, queue, rs)
		return c.lost(ctx, queue, rs, func(k receiptKey) bool { return done[k] })
	})
}

// Extend sets the leases of receipts to end timeout from now (Q1: the messages stay
// invisible that much longer). Errors: ErrInvalidArgument for a timeout under 1ms,
// ErrLeaseLost.
func (c *Client) Extend(ctx context.Context, timeout time.Duration, receipts ...Receipt) error {
	if timeout < time.Millisecond {
		return invalid(ErrInvalidArgument, "extend: visibility timeout %v must be at least 1ms", timeout)
	}
	return forEachQueue(receipts, func(queue string, rs []Receipt) error {
		offs, toks := receiptArrays(rs)
		rows, err := c.pool.Query(ctx, `SELECT "offset", lease_token FROM streamd.queue_extend($1, $2, $3, $4, $5)`,
			queue, offs, toks, timeout.Milliseconds(), c.sqlNow())
		if err != nil {
			return fmt.Errorf("extend on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		done, err := collectOffsets(rows)
		if err != nil {
			return fmt.Errorf("extend on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		return c.lost(ctx, queue, rs, func(k receiptKey) bool { return done[k] })
	})
}

// Term ends messages for good: each moves to its dead-letter queue now, with reason as
// its last error, or is deleted when it has no dead-letter queue. Errors:
// ErrInvalidArgument for a reason that PostgreSQL's text cannot hold (invalid UTF-8,
// a NUL byte; nothing is termed then), ErrLeaseLost.
func (c *Client) Term(ctx context.Context, reason string, receipts ...Receipt) error {
	if why := pgtext.TextProblem(reason); why != "" {
		return invalid(ErrInvalidArgument, "term reason: %s", why)
	}
	return forEachQueue(receipts, func(queue string, rs []Receipt) error {
		offs, toks := receiptArrays(rs)
		reasons := make([]string, len(rs))
		for i := range reasons {
			reasons[i] = reason
		}
		rows, err := c.pool.Query(ctx, `SELECT "offset", lease_token FROM streamd.queue_term($1, $2, $3, $4, $5)`,
			queue, offs, toks, reasons, c.sqlNow())
		if err != nil {
			return fmt.Errorf("term on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		done, err := collectOffsets(rows)
		if err != nil {
			return fmt.Errorf("term on queue %s: %w", queue, sqlerr.Wrap(err))
		}
		c.metrics.add(c.metrics.deadLettered, queue, len(done))
		noteSelfSettled(ctx, queue, rs)
		return c.lost(ctx, queue, rs, func(k receiptKey) bool { return done[k] })
	})
}

// forEachQueue calls f once per queue, in queue order, with that queue's receipts,
// each (offset and lease token) once, in the order first given; it goes on after an
// ErrLeaseLost and returns the first error. Invalid receipts (a bad queue name, a
// negative offset) are refused before f runs for any queue.
//
// A receipt named twice used to reach the SQL twice: a nack or term of an exhausted
// message then moved it to the dead-letter queue twice (Q2), and Nack's metrics
// panicked on a negative count after the transaction had committed.
func forEachQueue(receipts []Receipt, f func(queue string, rs []Receipt) error) error {
	if len(receipts) == 0 {
		return nil
	}
	by := map[string][]Receipt{}
	seen := make(map[queueReceipt]bool, len(receipts))
	var queues []string
	for _, r := range receipts {
		if _, ok := by[r.Queue]; !ok {
			if err := checkName(r.Queue); err != nil {
				return err
			}
			queues = append(queues, r.Queue)
		}
		if r.Offset < 0 {
			return invalid(ErrInvalidArgument, "queue %s: receipt offset %d is negative", r.Queue, r.Offset)
		}
		k := queueReceipt{r.Queue, receiptKey{r.Offset, r.LeaseToken}}
		if seen[k] {
			continue
		}
		seen[k] = true
		by[r.Queue] = append(by[r.Queue], r)
	}
	sort.Strings(queues)
	var first error
	for _, q := range queues {
		if err := f(q, by[q]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func receiptArrays(rs []Receipt) ([]int64, [][16]byte) {
	offs := make([]int64, len(rs))
	toks := make([][16]byte, len(rs))
	for i, r := range rs {
		offs[i], toks[i] = r.Offset, r.LeaseToken
	}
	return offs, toks
}

type rowsLike interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// receiptKey names a receipt in what the SQL returns: each receipt it settled (for an
// ack, each it did not).
type receiptKey struct {
	offset int64
	token  [16]byte
}

func collectOffsets(rows rowsLike) (map[receiptKey]bool, error) {
	defer rows.Close()
	done := map[receiptKey]bool{}
	for rows.Next() {
		var k receiptKey
		if err := rows.Scan(&k.offset, &k.token); err != nil {
			return nil, err
		}
		done[k] = true
	}
	return done, rows.Err()
}

// settledCount is how many distinct receipts of rs are not in stale.
func settledCount(rs []Receipt, stale map[receiptKey]bool) int {
	seen := make(map[receiptKey]bool, len(rs))
	for _, r := range rs {
		if k := (receiptKey{r.Offset, r.LeaseToken}); !stale[k] {
			seen[k] = true
		}
	}
	return len(seen)
}

// lost returns a *LeaseLostError for the receipts not settled, and counts them in
// streamd_queue_lease_lost_total unless ctx says their handler settled them itself
// (withSelfSettled).
func (c *Client) lost(ctx context.Context, queue string, rs []Receipt, settled func(receiptKey) bool) error {
	var lost []Receipt
	n := 0
	self, _ := ctx.Value(selfSettledKey{}).(selfSettledSet)
	for _, r := range rs {
		k := receiptKey{r.Offset, r.LeaseToken}
		if !settled(k) {
			lost = append(lost, r)
			if !self[queueReceipt{queue, k}] {
				n++
			}
		}
	}
	if len(lost) == 0 {
		return nil
	}
	c.metrics.add(c.metrics.leaseLost, queue, n)
	return &LeaseLostError{Queue: queue, Receipts: lost}
}

// queueReceipt names one receipt of one queue.
type queueReceipt struct {
	queue string
	receiptKey
}

// A Work handler may settle its own message (AckTx in the transaction of its own
// writes, as the Handler doc recommends, or Ack, Nack, Term); Work's settlement then
// finds the receipt spent. That is not a lost lease, and used to be counted as one.
// The handler's ctx carries a *handlerSettle that its settlements mark (the database
// still decides what is settled; the mark only says who spent the receipt), and
// Work's settlement ctx then carries the receipt in a selfSettledSet, whose lost
// receipts lost does not count.
type (
	handlerSettleKey struct{}
	selfSettledKey   struct{}
	selfSettledSet   map[queueReceipt]bool
)

// handlerSettle is what a Work handler's ctx carries: its message's receipt, and
// whether a settlement under that ctx named it.
type handlerSettle struct {
	r    queueReceipt
	done atomic.Bool
}

// noteSelfSettled marks ctx's handlerSettle (if any) when rs, receipts of queue that
// a settlement just sent to the database, include its receipt.
func noteSelfSettled(ctx context.Context, queue string, rs []Receipt) {
	h, _ := ctx.Value(handlerSettleKey{}).(*handlerSettle)
	if h == nil || h.r.queue != queue {
		return
	}
	for _, r := range rs {
		if (receiptKey{r.Offset, r.LeaseToken}) == h.r.receiptKey {
			h.done.Store(true)
			return
		}
	}
}

// withSelfSettled returns ctx carrying rs, receipts that their handlers settled
// themselves: lost does not count them as lost leases.
func withSelfSettled(ctx context.Context, rs ...queueReceipt) context.Context {
	if len(rs) == 0 {
		return ctx
	}
	set := make(selfSettledSet, len(rs))
	for _, r := range rs {
		set[r] = true
	}
	return context.WithValue(ctx, selfSettledKey{}, set)
}
