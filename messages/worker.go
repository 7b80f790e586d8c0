package messages

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/internal/sqlerr"
)

// Handler processes one message. Its return value settles the message: nil acks it,
// an error from TermError dead-letters it now, an error from RetryAfter nacks it with
// that delay, any other error nacks it with the worker's backoff; the error's text is
// the message's last error (invalid UTF-8 and NUL bytes, which PostgreSQL's text
// refuses, as U+FFFD). ctx is not Work's:
// when Work's ctx ends, running handlers go on and settle (WorkerConfig.DrainTimeout).
// ctx is cancelled when the drain runs out of time (an error returned then releases
// the message without spending its delivery attempt), when Work stops on an error,
// and when the message's lease is lost; the handler should then return quickly (its
// result no longer settles a lost lease). A handler may settle the
// message itself, e.g. with AckTx in the transaction of its own writes (exactly-once
// effects); Work's settlement then finds the receipt spent and does nothing. Pass
// ctx (or a ctx derived from it) to that settlement: Work then knows that the handler
// spent the receipt and does not count its own refused settlement (nor the lease
// extension's) in streamd_queue_lease_lost_total. The lease is still extended until
// the settlement commits: a handler whose transaction rolls back keeps its message.
type Handler func(ctx context.Context, m *Message) error

type termError struct{ err error }

func (e *termError) Error() string { return "term: " + e.reason() }
func (e *termError) Unwrap() error { return e.err }

// reason is the dead letter's last error: err's text, or "terminated" for a nil err.
func (e *termError) reason() string {
	if e.err == nil {
		return "terminated"
	}
	return e.err.Error()
}

// TermError wraps err so that a Handler returning it dead-letters the message now
// (Term), with err's text as the reason ("terminated" when err is nil).
func TermError(err error) error { return &termError{err: err} }

type retryError struct {
	err   error
	delay time.Duration
}

func (e *retryError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("retry after %v", e.delay)
	}
	return e.err.Error()
}
func (e *retryError) Unwrap() error { return e.err }

// RetryAfter wraps err so that a Handler returning it nacks the message with delay d
// instead of the worker's backoff (err may be nil: the nack then records "retry after
// d").
func RetryAfter(err error, d time.Duration) error { return &retryError{err: err, delay: d} }

// ExponentialBackoff returns a backoff schedule: base for the first attempt, doubling
// per attempt, capped at max.
func ExponentialBackoff(base, max time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := base
		for i := 1; i < attempt && d < max; i++ {
			d *= 2
		}
		return min(d, max)
	}
}

// defaultWorkerVisibilityTimeout is WorkerConfig.VisibilityTimeout's default.
const defaultWorkerVisibilityTimeout = 30 * time.Second

// WorkerConfig configures Work. A nil *WorkerConfig means the defaults.
type WorkerConfig struct {
	// Backoff is the nack delay after a handler error, by delivery attempt (1 for the
	// first); a negative delay counts as 0. Defaults to ExponentialBackoff(1s, 5m).
	Backoff func(attempt int) time.Duration
	// Concurrency is the most handlers running at once. Defaults to 10.
	Concurrency int
	// DrainTimeout bounds a clean stop (Work's ctx ended): the running handlers go on
	// with a live ctx for up to DrainTimeout and their messages are settled as usual;
	// past it their ctx is cancelled, and a handler that then returns an error has its
	// message released (Client.Release: visible again at once, the delivery attempt not
	// spent). Messages received but not yet handed to a handler are released too. So
	// clean stops, however many, never dead-letter a message. Defaults to 10s.
	DrainTimeout time.Duration
	// ExtendEvery is how often a running handler's lease is extended (to
	// VisibilityTimeout from then). Defaults to VisibilityTimeout / 3.
	ExtendEvery time.Duration
	// PollWait is how long one receive long-polls an empty queue. Defaults to 5s.
	PollWait time.Duration
	// SettleTimeout bounds each settlement, which runs even after Work's ctx ends.
	// Defaults to 10s.
	SettleTimeout time.Duration
	// VisibilityTimeout is the lease each receive takes. Defaults to 30s.
	VisibilityTimeout time.Duration
}

func (w *WorkerConfig) validate() error {
	switch {
	case w.Concurrency < 0:
		return invalid(ErrInvalidArgument, "WorkerConfig.Concurrency %d is negative", w.Concurrency)
	case w.Concurrency > 10000:
		return invalid(ErrInvalidArgument, "WorkerConfig.Concurrency %d exceeds 10000", w.Concurrency)
	case w.DrainTimeout < 0:
		return invalid(ErrInvalidArgument, "WorkerConfig.DrainTimeout %v is negative", w.DrainTimeout)
	case w.ExtendEvery < 0:
		return invalid(ErrInvalidArgument, "WorkerConfig.ExtendEvery %v is negative", w.ExtendEvery)
	case w.PollWait < 0:
		return invalid(ErrInvalidArgument, "WorkerConfig.PollWait %v is negative", w.PollWait)
	case w.SettleTimeout < 0:
		return invalid(ErrInvalidArgument, "WorkerConfig.SettleTimeout %v is negative", w.SettleTimeout)
	case w.VisibilityTimeout < 0 || (w.VisibilityTimeout > 0 && w.VisibilityTimeout < time.Millisecond):
		return invalid(ErrInvalidArgument, "WorkerConfig.VisibilityTimeout %v must be at least 1ms", w.VisibilityTimeout)
	case w.ExtendEvery > 0 && w.ExtendEvery >= cmp.Or(w.VisibilityTimeout, defaultWorkerVisibilityTimeout):
		// (Against the lease Work will take, the default one included: extended
		// after it ended, every lease would be lost.)
		return invalid(ErrInvalidArgument, "WorkerConfig.ExtendEvery %v must be shorter than VisibilityTimeout %v",
			w.ExtendEvery, cmp.Or(w.VisibilityTimeout, defaultWorkerVisibilityTimeout))
	}
	return nil
}

// Work receives messages of queue and runs handler on each, at most
// cfg.Concurrency at a time, until ctx ends; it then stops cleanly and returns nil:
// it receives no more, releases (Client.Release) what a last receive returned, lets
// the running handlers finish with a live ctx for up to cfg.DrainTimeout (then
// cancels it), and settles their messages; a handler cut short by the drain timeout
// has its message released, not nacked. A clean stop spends no delivery attempt of a
// message that no handler failed. While a handler runs, its lease is extended every
// cfg.ExtendEvery; if an extension finds the lease lost, the handler's ctx is
// cancelled. A receive that fails for a retriable reason (connection lost, server
// restart) is retried with backoff; any other receive error (the queue was deleted)
// stops Work: the running handlers' ctx is cancelled at once, Work waits for them and
// returns the error. A lease extension that finds the queue deleted counts as the
// lease lost.
//
// Acks are batched: the acks of handlers that return while an ack is on its way to
// the database go together in the next one (one statement, one round trip), without
// waiting for a timer. A handler's slot is freed once its message is settled.
//
// Goroutines: Work owns one goroutine per running handler, plus one lease extender
// per handler, plus one acker that sends the batched acks; the handlers and extenders
// end before Work returns, and the acker after them (when Work closes its queue).
func (c *Client) Work(ctx context.Context, queue string, cfg *WorkerConfig, handler Handler) error {
	w := WorkerConfig{}
	if cfg != nil {
		w = *cfg
	}
	if err := checkName(queue); err != nil {
		return err
	}
	if handler == nil {
		return invalid(ErrInvalidArgument, "work on queue %s: nil handler", queue)
	}
	if err := w.validate(); err != nil {
		return err
	}
	if w.Backoff == nil {
		w.Backoff = ExponentialBackoff(time.Second, 5*time.Minute)
	}
	if w.Concurrency == 0 {
		w.Concurrency = 10
	}
	if w.VisibilityTimeout == 0 {
		w.VisibilityTimeout = defaultWorkerVisibilityTimeout
	}
	if w.ExtendEvery == 0 {
		w.ExtendEvery = w.VisibilityTimeout / 3
	}
	if w.PollWait == 0 {
		w.PollWait = 5 * time.Second
	}
	if w.SettleTimeout == 0 {
		w.SettleTimeout = 10 * time.Second
	}
	if w.DrainTimeout == 0 {
		w.DrainTimeout = 10 * time.Second
	}
	log := c.logger.With(slog.String("queue", queue))
	log.Info("queue worker started", slog.Int("concurrency", w.Concurrency))
	defer log.Info("queue worker stopped")

	acks := newAcker(c, w.Concurrency, w.SettleTimeout)
	go acks.run(context.WithoutCancel(ctx))
	slots := make(chan struct{}, w.Concurrency)
	// The handlers run under handlersCtx, which is not ctx: a clean stop drains them
	// (they used to see ctx cancelled, and their messages were nacked, spending an
	// attempt each stop). It ends DrainTimeout after ctx does, and at once when Work
	// stops on a receive error (the caller's ctx is still live then, and the handlers
	// used to run on until the caller cancelled it, forever after a DeleteQueue).
	handlersCtx, stopHandlers := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	var fatal bool
	defer func() {
		if fatal {
			stopHandlers()
		} else {
			drain := time.AfterFunc(w.DrainTimeout, func() { // owner: Work (Stop below)
				log.Warn("queue worker drain timeout: cancelling the handlers still running",
					slog.Duration("drain_timeout", w.DrainTimeout))
				stopHandlers()
			})
			defer drain.Stop()
		}
		wg.Wait()
		stopHandlers()
		acks.close()
	}()
	retry := backoff.New(c.poll.MinInterval, 5*time.Second)
	for {
		// Wait for a free slot, then take every free slot for one receive.
		select {
		case <-ctx.Done():
			return nil
		case slots <- struct{}{}:
		}
		n := 1
	fill:
		for n < w.Concurrency {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break fill
			}
		}
		msgs, err := c.Receive(ctx, queue, &ReceiveOpts{Max: n, VisibilityTimeout: w.VisibilityTimeout, Wait: w.PollWait})
		for i := len(msgs); i < n; i++ {
			<-slots
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !sqlerr.Retriable(err) {
				fatal = true
				return fmt.Errorf("work on queue %s: %w", queue, err)
			}
			wait := retry.Next()
			log.Warn("queue receive failed; retrying", slog.Any("error", err), slog.Duration("retry_in", wait))
			if !backoff.Sleep(ctx, wait) {
				return nil
			}
			continue
		}
		retry.Reset()
		if ctx.Err() != nil && len(msgs) > 0 {
			// A receive that ctx's end did not interrupt (see Receive): its messages were
			// never handed to a handler, so they go back without spending an attempt.
			c.releaseUnhandled(ctx, log, &w, msgs)
			return nil
		}
		for _, m := range msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				c.handle(handlersCtx, log, &w, handler, acks, m)
			}()
		}
	}
}

// releaseUnhandled releases msgs, received by a stopping Work and never handed to a
// handler. On failure their leases expire and they are received again (at-least-once),
// with the attempt spent.
func (c *Client) releaseUnhandled(ctx context.Context, log *slog.Logger, w *WorkerConfig, msgs []*Message) {
	rs := make([]Receipt, len(msgs))
	for i, m := range msgs {
		rs[i] = m.Receipt
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.SettleTimeout)
	defer cancel()
	if err := c.Release(rctx, rs...); err != nil {
		log.Warn("queue release of unhandled messages failed", slog.Int("messages", len(rs)), slog.Any("error", err))
	}
}

// handle runs handler on m with lease extension and settles m from its result. ctx
// is the handlers' ctx: it ends when Work's drain runs out or Work fails.
func (c *Client) handle(ctx context.Context, log *slog.Logger, w *WorkerConfig, handler Handler, acks *acker, m *Message) {
	self := &handlerSettle{r: queueReceipt{m.Receipt.Queue, receiptKey{m.Receipt.Offset, m.Receipt.LeaseToken}}}
	hctx, cancel := context.WithCancel(context.WithValue(ctx, handlerSettleKey{}, self))
	defer cancel()
	stop := make(chan struct{})
	extenderDone := make(chan struct{})
	go func() {
		defer close(extenderDone)
		t := time.NewTicker(w.ExtendEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			// A handler that settled the message itself (AckTx, ...) may still roll its
			// transaction back: the lease is kept until the settlement shows. Such an
			// extension waits for the row lock of the handler's transaction (bounded by
			// SettleTimeout), and finds the lease gone once that transaction commits.
			settled := self.done.Load()
			ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), w.SettleTimeout)
			err := c.Extend(ectx, w.VisibilityTimeout, m.Receipt)
			ecancel()
			// A deleted queue took the message with it: the lease is lost as surely as
			// a stale receipt's (it used to count as transient, and the handler ran
			// on with a live ctx).
			if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrQueueNotFound) {
				if settled {
					return // the handler's own settlement committed: nothing was lost
				}
				log.Warn("queue lease lost while the handler ran", slog.Int64("offset", m.Offset),
					slog.String("message_id", m.MessageID), slog.Any("error", err))
				cancel()
				return
			}
			if err != nil {
				// A transient failure (or, after the handler's own settlement, a wait for
				// its transaction): the lease may still hold; try again next tick.
				level := slog.LevelWarn
				if settled {
					level = slog.LevelDebug
				}
				log.Log(ctx, level, "queue lease extension failed", slog.Int64("offset", m.Offset), slog.Any("error", err))
			}
		}
	}()

	start := time.Now()
	herr := runHandler(hctx, handler, m)
	c.metrics.handlerTime.WithLabelValues(m.Queue).Observe(time.Since(start).Seconds())
	close(stop)
	<-extenderDone

	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), w.SettleTimeout)
	defer scancel()
	// Settled by the handler itself: Work still settles (the handler's transaction
	// may have rolled back), but a refusal is then no lost lease.
	selfSettled := self.done.Load()
	if selfSettled {
		sctx = withSelfSettled(sctx, self.r)
	}
	// The error's text goes as PostgreSQL's text takes it (pgtext.Clean): a NUL byte
	// or invalid UTF-8 in it made the settlement fail, and the message waited out its
	// lease, neither dead-lettered nor given back.
	var err error
	var term *termError
	var retry *retryError
	switch {
	case herr == nil:
		err = acks.ack(m.Receipt, selfSettled)
	case errors.As(herr, &term):
		err = c.Term(sctx, pgtext.Clean(term.reason()), m.Receipt)
	case errors.As(herr, &retry):
		err = c.Nack(sctx, &NackOpts{Delay: max(retry.delay, 0), Error: pgtext.Clean(herr.Error())}, m.Receipt)
	case ctx.Err() != nil:
		// Interrupted by Work's stop (the drain ran out, or Work failed): not a failed
		// delivery. Give the message back at once for another worker, its attempt not
		// spent: a nack spent one per stop, and enough stops dead-lettered it.
		err = c.Release(sctx, m.Receipt)
	default:
		// A negative delay from the schedule counts as 0: refused by Nack, it left the
		// message leased until its lease ran out.
		err = c.Nack(sctx, &NackOpts{Delay: max(w.Backoff(m.DeliveryAttempts), 0), Error: pgtext.Clean(herr.Error())}, m.Receipt)
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		log.Debug("queue settlement refused: lease lost", slog.Int64("offset", m.Offset))
	case err != nil:
		// The lease will expire and the message be redelivered (at-least-once).
		log.Warn("queue settlement failed", slog.Int64("offset", m.Offset), slog.Any("error", err))
	}
}

// runHandler calls handler, turning a panic into an error.
func runHandler(ctx context.Context, handler Handler, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return handler(ctx, m)
}

// acker batches the acks of one Work loop: ack queues a receipt and waits for its
// result; run sends whatever is queued as one Ack. It never waits to fill a batch, so
// an idle worker's ack goes at once and a busy worker's acks go together.
type acker struct {
	c       *Client
	max     int
	timeout time.Duration
	reqs    chan ackReq
	done    chan struct{}
}

type ackReq struct {
	r    Receipt
	self bool // the handler settled r itself
	res  chan error
}

func newAcker(c *Client, max int, timeout time.Duration) *acker {
	return &acker{c: c, max: max, timeout: timeout, reqs: make(chan ackReq, max), done: make(chan struct{})}
}

// ack acks r in the next batch and returns its result: nil, a *LeaseLostError naming
// r, or the batch's error. self says the handler settled r itself (a refusal is then
// not counted as a lost lease).
func (a *acker) ack(r Receipt, self bool) error {
	res := make(chan error, 1)
	a.reqs <- ackReq{r: r, self: self, res: res}
	return <-res
}

// close ends run after it has answered every queued ack; call it once no ack can
// come any more.
func (a *acker) close() {
	close(a.reqs)
	<-a.done
}

// run sends the queued acks until close. Each batch gets its own timeout under ctx,
// which should not be cancelled by Work's shutdown (settlement runs after it).
func (a *acker) run(ctx context.Context) {
	defer close(a.done)
	batch := make([]ackReq, 0, a.max)
	for first := range a.reqs {
		batch = append(batch[:0], first)
	drain:
		for len(batch) < a.max {
			select {
			case req, ok := <-a.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, req)
			default:
				break drain
			}
		}
		rs := make([]Receipt, len(batch))
		var self []queueReceipt
		for i, req := range batch {
			rs[i] = req.r
			if req.self {
				self = append(self, queueReceipt{req.r.Queue, receiptKey{req.r.Offset, req.r.LeaseToken}})
			}
		}
		actx, cancel := context.WithTimeout(withSelfSettled(ctx, self...), a.timeout)
		err := a.c.Ack(actx, rs...)
		cancel()
		var lost *LeaseLostError
		if errors.As(err, &lost) {
			stale := map[Receipt]bool{}
			for _, r := range lost.Receipts {
				stale[r] = true
			}
			for _, req := range batch {
				if stale[req.r] {
					req.res <- &LeaseLostError{Queue: lost.Queue, Receipts: []Receipt{req.r}}
				} else {
					req.res <- nil
				}
			}
			continue
		}
		for _, req := range batch {
			req.res <- err
		}
	}
}
