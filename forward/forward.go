// Package forward drains a stream into RabbitMQ (seed 002's enqueuer): a consumer
// group reads the stream, each batch is published over AMQP 0.9.1 with publisher
// confirms, and the batch's offset is committed only after the broker confirmed every
// message of it.
//
// Guarantees: at-least-once (a crash between the broker's confirm and the offset
// commit publishes the batch again on restart: consumers dedup by message id, which is
// the event id), and in order per partition (one handler call per partition at a
// time, one channel, and the next batch is published only after the previous one was
// confirmed and committed). Events of different partitions interleave.
//
// Goroutines: Run owns the consumer group (whose goroutines it documents) and one
// AMQP connection with one confirm-mode channel, shared by the partition handlers
// (amqp091's Channel is safe for concurrent publishing) and re-dialled after a failure
// by the next batch that needs it. Run returns nil after ctx is cancelled.
package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/promreg"
	"github.com/streamd/streamd/streams"
)

// Config configures a Forwarder. AMQPURL and Stream are required.
type Config struct {
	// AMQPURL is the broker, e.g. amqp://guest:guest@127.0.0.1:5672/. Required.
	AMQPURL string
	// ConfirmTimeout bounds the wait for the broker's confirms of one batch; past it
	// the batch is published again on a new connection. Defaults to 30s.
	ConfirmTimeout time.Duration
	// Exchange is the exchange to publish to. Defaults to "" (the default exchange,
	// which routes by queue name).
	Exchange string
	// Group is the consumer group whose offsets record progress. Defaults to
	// "streamd-forward-" + Stream.
	Group string
	// Logger receives the forwarder's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxBatchSize bounds the events published per confirm round. Defaults to 500.
	MaxBatchSize int
	// Queue, when set, is declared (durable) on connect, so that nothing published
	// is dropped for want of a queue. Defaults to "" (declare nothing).
	Queue string
	// Registerer receives the forwarder's metrics. Defaults to nil (no metrics).
	Registerer prometheus.Registerer
	// RoutingKey is the routing key of every message. Defaults to Queue.
	RoutingKey string
	// SessionTimeout is the consumer group session timeout: how long a killed
	// forwarder's partitions wait before another forwarder takes them. Defaults to 30s.
	SessionTimeout time.Duration
	// Stream is the stream to forward. Required.
	Stream string
}

func (c *Config) validate() error {
	switch {
	case c.AMQPURL == "":
		return errors.New("forward: Config.AMQPURL is required")
	case c.Stream == "":
		return errors.New("forward: Config.Stream is required")
	case c.ConfirmTimeout < 0:
		return fmt.Errorf("forward: Config.ConfirmTimeout must not be negative, got %s", c.ConfirmTimeout)
	case c.MaxBatchSize < 0:
		return fmt.Errorf("forward: Config.MaxBatchSize must not be negative, got %d", c.MaxBatchSize)
	case c.SessionTimeout < 0:
		return fmt.Errorf("forward: Config.SessionTimeout must not be negative, got %s", c.SessionTimeout)
	case c.Exchange == "" && c.Queue == "" && c.RoutingKey == "":
		return errors.New("forward: Config.Queue or Config.RoutingKey is required with the default exchange")
	}
	if _, err := amqp.ParseURI(c.AMQPURL); err != nil {
		return fmt.Errorf("forward: Config.AMQPURL: %w", err)
	}
	return nil
}

// Forwarder drains one stream into RabbitMQ. Create it with New and call Run.
type Forwarder struct {
	pool    *pgxpool.Pool
	cfg     Config
	metrics *metrics

	mu   sync.Mutex // guards conn, ch and ret
	conn *amqp.Connection
	ch   *amqp.Channel
	ret  *returns // the returns of ch
}

// returns records the messages the broker returned as unroutable on one channel.
// The broker sends a message's basic.return before its confirm, and the AMQP library
// hands the return to the notify channel before it resolves the confirm; but the
// goroutine that records it runs on its own. sync closes that gap: once it returns,
// every return handed over before the call is recorded.
type returns struct {
	mu   sync.Mutex
	ids  map[string]bool
	req  chan chan struct{} // sync requests, served by the recording goroutine
	done chan struct{}      // closed when the channel closed and everything was recorded
}

// record runs until the library closes in, recording each return, and serves sync
// requests between them.
func (r *returns) record(in <-chan amqp.Return) {
	defer close(r.done)
	add := func(ret amqp.Return) {
		r.mu.Lock()
		r.ids[ret.MessageId] = true
		r.mu.Unlock()
	}
	for {
		select {
		case ret, ok := <-in:
			if !ok {
				return
			}
			add(ret)
		case s := <-r.req:
			for drained := false; !drained; { // what is already handed over
				select {
				case ret, ok := <-in:
					if !ok {
						close(s)
						return
					}
					add(ret)
				default:
					drained = true
				}
			}
			close(s)
		}
	}
}

// sync waits until every return handed over before the call is recorded.
func (r *returns) sync(ctx context.Context) error {
	s := make(chan struct{})
	select {
	case r.req <- s:
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-s:
		return nil
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// New returns a Forwarder. A nil cfg is an empty Config (AMQPURL and Stream are
// required, so it fails). It fails when cfg is invalid, naming the field.
func New(pool *pgxpool.Pool, cfg *Config) (*Forwarder, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	return &Forwarder{pool: pool, cfg: c, metrics: m}, nil
}

// withDefaults returns a copy of c (nil: an empty Config) with the defaults filled
// in, or the error of validate.
func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if err := out.validate(); err != nil {
		return out, err
	}
	if out.ConfirmTimeout == 0 {
		out.ConfirmTimeout = 30 * time.Second
	}
	if out.Group == "" {
		out.Group = "streamd-forward-" + out.Stream
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.MaxBatchSize == 0 {
		out.MaxBatchSize = 500
	}
	if out.RoutingKey == "" {
		out.RoutingKey = out.Queue
	}
	if out.SessionTimeout == 0 {
		out.SessionTimeout = 30 * time.Second
	}
	return out, nil
}

// Run forwards until ctx is cancelled (then it returns nil) or the consumer group
// fails. A broker failure does not end Run: the batch is retried, forever and in
// order, on a new connection.
func (f *Forwarder) Run(ctx context.Context) error {
	defer f.closeConn()
	c, err := consumergroup.New(f.pool, &consumergroup.Config{
		Group:           f.cfg.Group,
		Logger:          f.cfg.Logger,
		MaxBatchSize:    f.cfg.MaxBatchSize,
		MaxRetries:      consumergroup.RetryForever, // never skip a batch: order and completeness come first
		OnHandlerError:  consumergroup.ErrorBlock,
		RetryBackoffMax: 5 * time.Second,
		SessionTimeout:  f.cfg.SessionTimeout,
		Stream:          f.cfg.Stream,
	})
	if err != nil {
		return fmt.Errorf("forward %s: %w", f.cfg.Stream, err)
	}
	f.cfg.Logger.Info("forwarder started", "stream", f.cfg.Stream, "group", f.cfg.Group, "exchange", f.cfg.Exchange, "routing_key", f.cfg.RoutingKey)
	err = c.Run(ctx, f.handle)
	f.cfg.Logger.Info("forwarder stopped", "stream", f.cfg.Stream, "error", err)
	return err
}

// handle publishes one batch and waits for every confirm; returning nil lets the
// consumer group commit the batch's offset (CommitAuto).
func (f *Forwarder) handle(ctx context.Context, b *consumergroup.Batch) error {
	ch, rets, err := f.channel()
	if err != nil {
		return err
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, f.cfg.ConfirmTimeout)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(b.Events))
	for i := range b.Events {
		dc, err := ch.PublishWithDeferredConfirmWithContext(cctx, f.cfg.Exchange, f.cfg.RoutingKey, true, false, publishing(&b.Events[i]))
		if err != nil {
			f.fail(ch)
			return fmt.Errorf("forward %s/%d@%d: publish: %w", b.Stream, b.Partition, b.Events[i].Offset, err)
		}
		confirms = append(confirms, dc)
	}
	for i, dc := range confirms {
		ok, err := dc.WaitContext(cctx)
		if err != nil || !ok {
			f.fail(ch)
			f.metrics.nacks.Inc()
			return fmt.Errorf("forward %s/%d@%d: broker did not confirm (acked=%v): %v", b.Stream, b.Partition, b.Events[i].Offset, ok, err)
		}
	}
	// The confirms are in; the returns sent before them are recorded once sync
	// returns (else an unroutable message could be committed as delivered).
	if err := rets.sync(cctx); err != nil {
		f.fail(ch)
		return fmt.Errorf("forward %s/%d: wait for the broker's returns: %w", b.Stream, b.Partition, err)
	}
	if id := rets.returned(b.Events); id != "" {
		return fmt.Errorf("forward %s/%d: message %s was unroutable (exchange %q, routing key %q)", b.Stream, b.Partition, id, f.cfg.Exchange, f.cfg.RoutingKey)
	}
	f.metrics.records.Add(float64(len(b.Events)))
	f.metrics.confirm.Observe(time.Since(start).Seconds())
	return nil
}

// publishing maps an event to an AMQP message: the event id is the message id (for
// dedup downstream), and the position travels in headers.
func publishing(e *streams.Event) amqp.Publishing {
	p := amqp.Publishing{
		MessageId:     e.EventID,
		Type:          e.EventType,
		CorrelationId: e.CorrelationID,
		Timestamp:     e.Timestamp,
		DeliveryMode:  amqp.Persistent,
		Headers: amqp.Table{
			"streamd-stream":    e.Stream,
			"streamd-partition": int64(e.Partition),
			"streamd-offset":    e.Offset,
			"streamd-version":   int64(e.Version),
		},
	}
	if e.Key != "" {
		p.Headers["streamd-key"] = e.Key
	}
	if e.CausationID != "" {
		p.Headers["streamd-causation-id"] = e.CausationID
	}
	for k, v := range e.Headers {
		p.Headers["x-"+k] = v
	}
	if e.Bytes != nil {
		p.ContentType, p.Body = "application/octet-stream", e.Bytes
	} else {
		p.ContentType, p.Body = "application/json", e.Data
	}
	return p
}

// channel returns the open confirm-mode channel and its returns, dialling when there
// is none.
func (f *Forwarder) channel() (*amqp.Channel, *returns, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ch != nil && !f.ch.IsClosed() {
		return f.ch, f.ret, nil
	}
	f.closeLocked()
	conn, err := amqp.Dial(f.cfg.AMQPURL)
	if err != nil {
		f.metrics.connects.WithLabelValues("error").Inc()
		return nil, nil, fmt.Errorf("forward: connect to broker: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err == nil && f.cfg.Queue != "" {
		_, err = ch.QueueDeclare(f.cfg.Queue, true, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		f.metrics.connects.WithLabelValues("error").Inc()
		return nil, nil, fmt.Errorf("forward: open confirm channel: %w", err)
	}
	f.metrics.connects.WithLabelValues("ok").Inc()
	rets := &returns{ids: map[string]bool{}, req: make(chan chan struct{}), done: make(chan struct{})}
	f.conn, f.ch, f.ret = conn, ch, rets
	go rets.record(ch.NotifyReturn(make(chan amqp.Return, 16))) // owner: the channel; ends when it closes
	f.cfg.Logger.Info("forwarder connected to broker", "stream", f.cfg.Stream)
	return ch, rets, nil
}

// returned reports the first event of events the broker returned as unroutable (call
// sync first).
func (r *returns) returned(events []streams.Event) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range events {
		if r.ids[events[i].EventID] {
			delete(r.ids, events[i].EventID)
			return events[i].EventID
		}
	}
	return ""
}

// fail drops the connection ch belongs to, so the next batch dials a new one.
func (f *Forwarder) fail(ch *amqp.Channel) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ch == ch {
		f.closeLocked()
	}
}

func (f *Forwarder) closeConn() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closeLocked()
}

func (f *Forwarder) closeLocked() {
	if f.conn != nil {
		_ = f.conn.Close()
	}
	f.conn, f.ch = nil, nil
}

type metrics struct {
	records  prometheus.Counter
	nacks    prometheus.Counter
	confirm  prometheus.Histogram
	connects *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{Name: "streamd_forward_records_total",
			Help: "Events published to the broker and confirmed."}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "streamd_forward_failed_batches_total",
			Help: "Batches the broker did not confirm (nack, timeout or lost connection); they are published again."}),
		confirm: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "streamd_forward_batch_duration_seconds",
			Help: "Time from the first publish of a batch to its last confirm.", Buckets: prometheus.DefBuckets}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "streamd_forward_connects_total",
			Help: "Connection attempts to the broker, by result (ok, error)."}, []string{"result"}),
	}
	if err := errors.Join(promreg.Register(reg, &m.records), promreg.Register(reg, &m.nacks),
		promreg.Register(reg, &m.confirm), promreg.Register(reg, &m.connects)); err != nil {
		return nil, fmt.Errorf("forward: %w", err)
	}
	return m, nil
}
