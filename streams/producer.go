package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
)

// ProducerConfig configures a Producer. A nil *ProducerConfig means the defaults.
type ProducerConfig struct {
	// Linger is how long a partition's first buffered record waits for more before its
	// batch is sent. Defaults to 0: a batch is sent as soon as the partition has no
	// batch in flight, and records that arrive meanwhile form the next batch, so
	// batches grow with load without adding latency when idle.
	Linger time.Duration
	// Logger receives the producer's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxBatchBytes bounds the payload bytes of one batch. Defaults to 1 MiB.
	MaxBatchBytes int
	// MaxBatchRecords bounds the records of one batch (one transaction). Defaults to 1000.
	MaxBatchRecords int
	// MaxBufferedRecords bounds the records buffered or in flight; Produce blocks while
	// the buffer is full. Defaults to 100000.
	MaxBufferedRecords int
	// MaxInFlight bounds the append transactions running at once, across partitions.
	// Defaults to 4.
	MaxInFlight int
	// MetadataMaxAge is how long a stream's partition count and payload limit are
	// cached. Past it, one Produce call to the stream reads them again while the others
	// go on with the cached copy. A record that the cached copy refuses (a partition
	// the stream did not have, a payload over its limit) makes the producer read them
	// again first, at most once a second per stream. Defaults to 30s.
	MetadataMaxAge time.Duration
	// Registerer registers the producer's metrics. Defaults to nil: no metrics.
	Registerer prometheus.Registerer
	// RetryTimeout is how long a batch that failed with a retriable error (a broken
	// connection, a server restart) is retried. Retries are safe: every record carries
	// its event id, so a batch that did commit is not stored twice. Defaults to 30s.
	RetryTimeout time.Duration
}

func (c *ProducerConfig) withDefaults() (ProducerConfig, error) {
	out := ProducerConfig{}
	if c != nil {
		out = *c
	}
	switch {
	case out.Linger < 0:
		return out, fmt.Errorf("%w: ProducerConfig.Linger %v is negative", ErrInvalidArgument, out.Linger)
	case out.MaxBatchBytes < 0:
		return out, fmt.Errorf("%w: ProducerConfig.MaxBatchBytes %d is negative", ErrInvalidArgument, out.MaxBatchBytes)
	case out.MaxBatchRecords < 0:
		return out, fmt.Errorf("%w: ProducerConfig.MaxBatchRecords %d is negative", ErrInvalidArgument, out.MaxBatchRecords)
	case out.MaxBufferedRecords < 0:
		return out, fmt.Errorf("%w: ProducerConfig.MaxBufferedRecords %d is negative", ErrInvalidArgument, out.MaxBufferedRecords)
	case out.MaxInFlight < 0:
		return out, fmt.Errorf("%w: ProducerConfig.MaxInFlight %d is negative", ErrInvalidArgument, out.MaxInFlight)
	case out.MetadataMaxAge < 0:
		return out, fmt.Errorf("%w: ProducerConfig.MetadataMaxAge %v is negative", ErrInvalidArgument, out.MetadataMaxAge)
	case out.RetryTimeout < 0:
		return out, fmt.Errorf("%w: ProducerConfig.RetryTimeout %v is negative", ErrInvalidArgument, out.RetryTimeout)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.MaxBatchBytes == 0 {
		out.MaxBatchBytes = 1 << 20
	}
	if out.MaxBatchRecords == 0 {
		out.MaxBatchRecords = 1000
	}
	if out.MaxBufferedRecords == 0 {
		out.MaxBufferedRecords = 100000
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = 4
	}
	if out.MetadataMaxAge == 0 {
		out.MetadataMaxAge = 30 * time.Second
	}
	if out.RetryTimeout == 0 {
		out.RetryTimeout = 30 * time.Second
	}
	return out, nil
}

// Producer batches concurrent Produce calls per partition into one append
// transaction per batch, and runs the batches of different partitions in parallel.
// A record's position is reported only after its batch committed.
//
// Ordering: records produced to one partition are appended in the order their
// Produce calls enqueued them (one batch per partition is in flight at a time).
//
// Concurrency: all methods are safe for concurrent use. Close must be called to flush
// and release the producer's goroutines.
type Producer struct {
	pool    *pgxpool.Pool
	cfg     ProducerConfig
	metrics *producerMetrics

	bufSem      chan struct{} // one token per buffered record
	inFlightSem chan struct{} // one token per running append
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup // send goroutines

	mu     sync.Mutex
	closed bool
	parts  map[partKey]*partQueue
	idle   *sync.Cond // signalled when records finish
	// Flush waits for the records of its epoch and earlier only: records produced
	// meanwhile (by other goroutines, under steady load) do not keep it waiting.
	epoch      uint64
	unfinished map[uint64]int // per epoch: records enqueued and not yet done

	// metaMu guards meta and its entries. It is never held across I/O: a stream's
	// metadata is loaded by one caller at a time outside the lock (metaEntry.loading),
	// so that Produce calls to other streams, or to this one while a cached copy
	// exists, do not wait for the load.
	metaMu sync.Mutex
	meta   map[string]*metaEntry
}

type partKey struct {
	stream    string
	partition int32
}

type partQueue struct {
	key       partKey
	pending   []*pendingRecord
	bytes     int
	sending   bool
	lingering bool // a linger timer is armed
	lingerDue bool // the linger timer fired while a batch was in flight
}

type pendingRecord struct {
	rec   Record
	done  func(Position, error)
	epoch uint64 // Producer.epoch when enqueued
}

// streamMeta is a stream's metadata as read at fetchedAt. It is never modified once
// loaded: a refresh replaces it.
type streamMeta struct {
	partitions      int32
	maxPayloadBytes int32
	fetchedAt       time.Time
}

// metaEntry is what the producer knows of one stream. Guarded by Producer.metaMu.
type metaEntry struct {
	meta       *streamMeta // nil until the first load succeeds
	loading    *metaLoad   // the load running now, if any
	sticky     int32       // partition for keyless records
	stickyLeft int         // records left before the sticky partition rotates
}

// metaLoad is one load of a stream's metadata, run by the caller that started it;
// other callers that need it wait for done or their ctx.
type metaLoad struct {
	done chan struct{} // closed when the load ended; meta, err and cut are set before
	meta *streamMeta
	err  error
	cut  bool // the loader's ctx ended: its error says nothing about the stream
}

// NewProducer returns a Producer appending through pool.
func NewProducer(pool *pgxpool.Pool, cfg *ProducerConfig) (*Producer, error) {
	conf, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newProducerMetrics(conf.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Producer{
		pool:        pool,
		cfg:         conf,
		metrics:     m,
		bufSem:      make(chan struct{}, conf.MaxBufferedRecords),
		inFlightSem: make(chan struct{}, conf.MaxInFlight),
		ctx:         ctx,
		cancel:      cancel,
		parts:       map[partKey]*partQueue{},
		meta:        map[string]*metaEntry{},
		unfinished:  map[uint64]int{},
	}
	p.idle = sync.NewCond(&p.mu)
	return p, nil
}

// Produce appends rec and blocks until its batch committed, returning its position.
// Bad input (unknown stream or partition, invalid name or JSON, payload over the
// stream's limit) fails at once with the typed error and affects no other record.
//
// If ctx ends first, Produce returns ctx.Err(); the record may still be appended
// (its event id makes a later retry of the same record idempotent).
func (p *Producer) Produce(ctx context.Context, rec Record) (Position, error) {
	type result struct {
		pos Position
		err error
	}
	ch := make(chan result, 1)
	p.ProduceAsync(ctx, rec, func(pos Position, err error) { ch <- result{pos, err} })
	select {
	case r := <-ch:
		return r.pos, r.err
	case <-ctx.Done():
		return Position{}, ctx.Err()
	}
}

// ProduceAsync enqueues rec and returns; done is called exactly once with the record's
// position after its batch committed, or with the error.
//
// Concurrency contract (as franz-go states its promises): done runs on the producer's
// goroutines, one per partition's batch in flight, so the done calls of different
// partitions run concurrently with each other and with the caller: done must be safe
// for concurrent use. The done calls of one partition run one at a time, in the order
// their records were enqueued. An error found before rec was enqueued (bad input, an
// unknown stream, ctx ended, the producer closed) is reported on a goroutine of its
// own, concurrently with everything else. done is never called from inside
// ProduceAsync, so the caller may hold a lock that done takes. done must not block
// for long: it delays the partition's next batch. It must not call the Producer
// (Produce, Flush, Close): they wait for batches that wait for done. ProduceAsync blocks only while the buffer
// is full (MaxBufferedRecords) or while the stream's metadata is loaded (when none is
// cached, or to check a partition or payload size that the cached copy refuses), and
// returns when ctx ends.
func (p *Producer) ProduceAsync(ctx context.Context, rec Record, done func(Position, error)) {
	if err := validateRecord(&rec); err != nil {
		p.failAsync(done, err)
		return
	}
	partition, err := p.route(ctx, &rec)
	if err != nil {
		p.failAsync(done, err)
		return
	}
	if rec.EventID == "" {
		// Assigned now so that a retried batch is deduplicated by the database.
		rec.EventID = newEventID()
	}
	select {
	case p.bufSem <- struct{}{}:
	case <-ctx.Done():
		p.failAsync(done, ctx.Err())
		return
	}
	pr := &pendingRecord{rec: rec, done: done}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.bufSem
		p.failAsync(done, ErrProducerClosed)
		return
	}
	pr.epoch = p.epoch
	p.unfinished[pr.epoch]++
	key := partKey{rec.Stream, partition}
	q := p.parts[key]
	if q == nil {
		q = &partQueue{key: key}
		p.parts[key] = q
	}
	q.pending = append(q.pending, pr)
	q.bytes += len(rec.Data) + len(rec.Bytes) + len(rec.Key)
	p.maybeSendLocked(q)
	p.mu.Unlock()
}

// failAsync reports an error found before a record was enqueued. done runs on a
// goroutine of its own, which ends when done returns, as ProduceAsync promises: the
// caller of ProduceAsync may hold a lock that done takes. The record counts as
// unfinished until done returns, so that Flush (and Close, which flushes) still waits
// for every done of the records produced before it.
func (p *Producer) failAsync(done func(Position, error), err error) {
	p.mu.Lock()
	epoch := p.epoch
	p.unfinished[epoch]++
	p.mu.Unlock()
	go func() {
		done(Position{}, err)
		p.mu.Lock()
		if p.unfinished[epoch]--; p.unfinished[epoch] <= 0 {
			delete(p.unfinished, epoch)
		}
		p.idle.Broadcast()
		p.mu.Unlock()
	}()
}

// maybeSendLocked starts a batch for q when one is due: nothing in flight and either
// no linger, a full batch, or the linger elapsed. Otherwise it arms the linger timer.
// p.mu must be held.
func (p *Producer) maybeSendLocked(q *partQueue) {
	if q.sending || len(q.pending) == 0 {
		return
	}
	full := len(q.pending) >= p.cfg.MaxBatchRecords || q.bytes >= p.cfg.MaxBatchBytes
	if p.cfg.Linger == 0 || full || q.lingerDue || p.closed {
		p.startSendLocked(q)
		return
	}
	if !q.lingering {
		q.lingering = true
		time.AfterFunc(p.cfg.Linger, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			q.lingering = false
			q.lingerDue = true
			p.maybeSendLocked(q)
		})
	}
}

func (p *Producer) startSendLocked(q *partQueue) {
	n, bytes := 0, 0
	for n < len(q.pending) && n < p.cfg.MaxBatchRecords {
		r := &q.pending[n].rec
		size := len(r.Data) + len(r.Bytes) + len(r.Key)
		if n > 0 && bytes+size > p.cfg.MaxBatchBytes {
			break
		}
		bytes += size
		n++
	}
	batch := make([]*pendingRecord, n)
	copy(batch, q.pending[:n])
	q.pending = append(q.pending[:0:0], q.pending[n:]...)
	q.bytes -= bytes
	q.sending = true
	q.lingerDue = false
	p.wg.Add(1)
	go p.send(q, batch)
}

// send appends one batch, owned by its goroutine until it reports the results and
// hands the partition to the next batch.
func (p *Producer) send(q *partQueue, batch []*pendingRecord) {
	defer p.wg.Done()
	p.inFlightSem <- struct{}{}
	recs := make([]Record, len(batch))
	for i, b := range batch {
		recs[i] = b.rec
		recs[i].Partition = &q.key.partition
	}
	start := time.Now()
	pos, err := p.appendWithRetry(recs)
	errs := make([]error, len(batch))
	for i := range errs {
		errs[i] = err
	}
	if err != nil && len(batch) > 1 && perRecordError(err) {
		// One record's fault (an unregistered event type, a key another session
		// holds, a payload over a limit lowered since the metadata was read, ...)
		// fails the whole statement: append the records one by one, in order, so that
		// only the bad ones fail. The metrics count those appends, not the batch, so
		// that records appended on their own are not counted as failures.
		pos = make([]Position, len(batch))
		for i := range recs {
			var one []Position
			start := time.Now()
			one, errs[i] = p.appendWithRetry(recs[i : i+1])
			p.metrics.observeBatch(1, time.Since(start), errs[i])
			if errs[i] == nil {
				pos[i] = one[0]
			}
		}
	} else {
		p.metrics.observeBatch(len(batch), time.Since(start), err)
	}
	<-p.inFlightSem
	if errors.Is(err, ErrPartitionNotFound) || errors.Is(err, ErrStreamNotFound) || errors.Is(err, ErrInvalidArgument) ||
		errors.Is(err, ErrPayloadTooLarge) {
		p.forgetMeta(q.key.stream) // the stream changed: read its metadata again
	}
	for i, b := range batch {
		if errs[i] != nil {
			b.done(Position{}, errs[i])
		} else {
			b.done(pos[i], nil)
		}
		<-p.bufSem
	}
	p.mu.Lock()
	for _, b := range batch {
		if p.unfinished[b.epoch]--; p.unfinished[b.epoch] <= 0 {
			delete(p.unfinished, b.epoch)
		}
	}
	q.sending = false
	if len(q.pending) == 0 {
		delete(p.parts, q.key)
	} else {
		p.maybeSendLocked(q)
	}
	p.idle.Broadcast()
	p.mu.Unlock()
}

// perRecordError reports whether a batch's error may come from one of its records
// alone (so that the others would append on their own).
//
// Of the event-sourcing codes (SD4xx), SD404 (a key held by another session) and SD406
// (an unregistered event type) are about one record; the Producer sends no session and
// no expected versions, so SD401 (version mismatch), SD402 and SD403 (session not
// open, expired) cannot come back, and SD405 (no key versions) is about the stream.
func perRecordError(err error) bool {
	switch {
	case errors.Is(err, ErrPayloadTooLarge), errors.Is(err, ErrInvalidJSON), errors.Is(err, ErrInvalidArgument):
		return true
	}
	switch sqlerr.Code(err) {
	case sqlerr.SessionHeld, sqlerr.UnknownEventType,
		"22P02", "22P05", "22021", // JSON or text PostgreSQL cannot take
		"54000": // program_limit_exceeded: an event id or key too large for its index
		return true
	}
	return false
}

func (p *Producer) appendWithRetry(recs []Record) ([]Position, error) {
	var pos []Position
	err := p.retry(p.ctx, recs[0].Stream, func() error {
		var err error
		pos, err = appendOwnTx(p.ctx, p.pool, recs[0].Stream, recs)
		return err
	})
	return pos, err
}

// retry runs fn until it succeeds, fails with an error that is not retriable, or
// RetryTimeout or ctx runs out, with jittered exponential backoff between attempts.
func (p *Producer) retry(ctx context.Context, stream string, fn func() error) error {
	deadline := time.Now().Add(p.cfg.RetryTimeout)
	bo := backoff.NewJittered(20*time.Millisecond, time.Second)
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !sqlerr.Retriable(err) || time.Now().Add(bo.Peek()).After(deadline) || ctx.Err() != nil {
			return err
		}
		p.cfg.Logger.Warn("database call failed; retrying", "stream", stream, "attempt", attempt, "err", err)
		p.metrics.retries.Inc()
		if !bo.Wait(ctx) {
			return err
		}
	}
}

// route picks rec's partition: the explicit one (checked against the partition
// count), the key's, or the stream's sticky partition for keyless records. It also
// checks the payload against the stream's limit, so bad records fail alone.
//
// A record that the cached metadata refuses (a partition the stream did not have, a
// payload over its limit) is checked again against metadata read afresh, at most once a
// second, before it is refused: the stream may have grown, or its limit been raised.
func (p *Producer) route(ctx context.Context, rec *Record) (int32, error) {
	m, err := p.metadata(ctx, rec.Stream, p.cfg.MetadataMaxAge, true)
	if err != nil {
		return 0, err
	}
	size := len(rec.Data) + len(rec.Bytes)
	refused := func(m *streamMeta) bool {
		return size > int(m.maxPayloadBytes) || (rec.Partition != nil && *rec.Partition >= m.partitions)
	}
	if refused(m) && time.Since(m.fetchedAt) > time.Second {
		if m, err = p.metadata(ctx, rec.Stream, time.Second, false); err != nil {
			return 0, err
		}
	}
	if size > int(m.maxPayloadBytes) {
		return 0, invalid(ErrPayloadTooLarge, "stream %s: payload of %d bytes exceeds the limit of %d bytes", rec.Stream, size, m.maxPayloadBytes)
	}
	switch {
	case rec.Partition != nil:
		if *rec.Partition >= m.partitions {
			return 0, invalid(ErrPartitionNotFound, "stream %s has no partition %d (it has %d)", rec.Stream, *rec.Partition, m.partitions)
		}
		return *rec.Partition, nil
	case rec.Key != "":
		return PartitionForKey(rec.Key, m.partitions), nil
	default:
		// Kafka's sticky partitioner: keyless records fill one partition's batch, then
		// move on, so they form large batches without unbalancing the partitions.
		p.metaMu.Lock()
		defer p.metaMu.Unlock()
		e := p.meta[rec.Stream]
		if e == nil { // forgotten meanwhile (the stream was deleted)
			return rand.Int32N(m.partitions), nil
		}
		if e.stickyLeft <= 0 || e.sticky >= m.partitions {
			e.sticky = rand.Int32N(m.partitions)
			e.stickyLeft = p.cfg.MaxBatchRecords
		}
		e.stickyLeft--
		return e.sticky, nil
	}
}

// metadata returns stream's metadata, read at most maxAge ago. When the cached copy is
// older, one caller loads it again (under ctx) while the others wait for that load or
// their ctx; with serveStale, they are served the older copy instead of waiting, when
// there is one. A load that fails because its caller's ctx ended is not taken as the
// answer by the callers waiting for it: one of them loads again.
func (p *Producer) metadata(ctx context.Context, stream string, maxAge time.Duration, serveStale bool) (*streamMeta, error) {
	for {
		p.metaMu.Lock()
		e := p.meta[stream]
		if e == nil {
			e = &metaEntry{}
			p.meta[stream] = e
		}
		if m := e.meta; m != nil && (time.Since(m.fetchedAt) <= maxAge || serveStale && e.loading != nil) {
			p.metaMu.Unlock()
			return m, nil
		}
		if l := e.loading; l != nil {
			p.metaMu.Unlock()
			select {
			case <-l.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if l.cut {
				continue
			}
			return l.meta, l.err
		}
		l := &metaLoad{done: make(chan struct{})}
		e.loading = l
		p.metaMu.Unlock()

		l.meta, l.err = p.loadMeta(ctx, stream)
		l.cut = l.err != nil && ctx.Err() != nil

		p.metaMu.Lock()
		e.loading = nil
		switch {
		case l.err == nil:
			e.meta = l.meta
		case errors.Is(l.err, ErrStreamNotFound):
			if p.meta[stream] == e {
				delete(p.meta, stream)
			}
		}
		close(l.done)
		p.metaMu.Unlock()
		return l.meta, l.err
	}
}

func (p *Producer) loadMeta(ctx context.Context, stream string) (*streamMeta, error) {
	m := &streamMeta{fetchedAt: time.Now()}
	err := p.retry(ctx, stream, func() error {
		return p.pool.QueryRow(ctx, "SELECT partitions, max_payload_bytes FROM streamd.streams WHERE stream_name = $1", stream).
			Scan(&m.partitions, &m.maxPayloadBytes)
	})
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, invalid(ErrStreamNotFound, "stream %q does not exist", stream)
		}
		return nil, fmt.Errorf("produce to %s: load stream metadata: %w", stream, err)
	}
	return m, nil
}

// forgetMeta marks stream's metadata as out of date, so that the next record routed to
// it loads it again; until that load ends, the old copy is served.
func (p *Producer) forgetMeta(stream string) {
	p.metaMu.Lock()
	defer p.metaMu.Unlock()
	if e := p.meta[stream]; e != nil && e.meta != nil {
		old := *e.meta
		old.fetchedAt = time.Time{}
		e.meta = &old
	}
}

// Flush sends every buffered record at once, ignoring Linger, and waits until all of
// them are committed or failed, or ctx ends. Records produced after Flush was called
// do not make it wait longer. The sends start before Flush returns, even when ctx has
// ended.
func (p *Producer) Flush(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { // wake the wait below when ctx ends
		p.mu.Lock()
		p.idle.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.epoch
	p.epoch++
	for _, q := range p.parts {
		q.lingerDue = true
		p.maybeSendLocked(q)
	}
	for p.unfinishedUpToLocked(target) {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.idle.Wait()
	}
	return nil
}

// unfinishedUpToLocked reports whether records of epoch target or earlier are not
// done yet. p.mu must be held.
func (p *Producer) unfinishedUpToLocked(target uint64) bool {
	for e := range p.unfinished {
		if e <= target {
			return true
		}
	}
	return false
}

// Close flushes the buffered records, waiting for them until ctx ends, then stops
// the producer: records still unsent then fail with ErrProducerClosed or the
// cancellation. Produce after Close fails with ErrProducerClosed.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.Flush(ctx)
	p.cancel()
	p.wg.Wait()
	return err
}
