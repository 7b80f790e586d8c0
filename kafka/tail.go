package kafka

import (
	"cmp"
	"context"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// Tail readers (DESIGN.md, Kafka, "Fetch"): a Kafka client keeps one fetch in flight
// per broker, so a record whose partition wakes while that fetch reads or answers
// waited for the answer, the client, its next fetch and that fetch's read. A tail
// reader reads one partition on its own, on each wake-up of that partition, into
// memory, whether or not a fetch is outstanding, as the native consumer's partition
// workers do; a fetch of offsets it holds answers from memory, with no statement of
// its own.
const (
	// tailIdle stops a reader no fetch used for this long.
	tailIdle = 30 * time.Second
	// tailMaxBytes and tailMaxRecords bound the records one reader holds (heldSize:
	// payload bytes and tailRecordOverhead each); the oldest go first.
	tailMaxBytes   = 1 << 20
	tailMaxRecords = 10000
	// tailTotalBytes bounds the records all the readers of a Server hold (heldSize):
	// a reader that finds the total past it keeps only its last read.
	tailTotalBytes = 64 << 20
	// tailRecordOverhead is what a held record costs beyond its payload: its Event
	// (about 250 bytes, and the spare room of the slice that holds it), its strings
	// and headers; about 950 bytes for a record of a read of its own
	// (TestTailReaderMemoryIsWhatItCounts). Counting the payload only, the bounds let
	// readers of small records hold tens of times their byte bounds.
	tailRecordOverhead = 1 << 10
	// tailMaxReaders bounds the readers of a Server; past it a partition is read by
	// the fetches, as without readers.
	tailMaxReaders = 1024
	// tailStartLag: a fetch that answers a partition without error at most this many
	// offsets below its high watermark starts its reader, at the offset it asked for
	// (the reader reads on from there: the client's next fetch, past what this one
	// answered, is in what it holds once it caught up).
	tailStartLag = fetchMaxRecords
	// tailCheckEvery is how often a reader reads its stream's identity (created_at)
	// and, at least, its partition (the safety net under the wake-ups): a change
	// made by another instance (a deletion, DeleteRecords, retention) is seen within
	// it.
	tailCheckEvery = time.Second
	// tailPollMin is a reader's first poll after a read that found records or a
	// wake-up; it doubles, up to the reader's check, while reads find nothing. It is
	// the native consumer's (streams.FetchOpts.PollInterval's default): a commit whose
	// wake-up is late (the tailer's stream held up) is read within it, as the native
	// worker's long poll reads it, not at the next wake-up or check.
	tailPollMin = 5 * time.Millisecond
)

// tailReaders are a Server's tail readers, by partition.
type tailReaders struct {
	mu     sync.Mutex
	ctx    context.Context // the readers' context; nil before Serve and after stopAll
	cancel context.CancelFunc
	byPart map[partKey]*tailReader
	wg     sync.WaitGroup // the readers' goroutines
	bytes  atomic.Int64   // the record bytes all readers hold

	// Tests (set under mu, before the readers they change start): off disables the
	// readers; idle, check and maxRecords replace tailIdle, tailCheckEvery and
	// tailMaxRecords; readHook is called
	// before each read of a reader, on its goroutine. running counts the readers'
	// goroutines; answered counts the fetches the readers answered, read those that
	// read the log instead.
	off        bool
	idle       time.Duration
	check      time.Duration
	maxRecords int
	readHook   func(topic string, partition int32)
	running    atomic.Int64
	answered   atomic.Int64
	read       atomic.Int64
}

// tailReadKey is the context key of a reader's statements (its value: the
// partition), which tests tell from a fetch's by it.
type tailReadKey struct{}

// tailReader holds the records of one partition from start to next (offsets it read:
// a record missing from it between them is not stored, by retention or compaction).
// mu guards the fields below it.
type tailReader struct {
	t      *tailReaders
	key    partKey
	ctx    context.Context
	cancel context.CancelFunc
	used   atomic.Int64 // when a fetch last used it (UnixNano)
	// idle, check, maxRecords and hook are tailIdle, tailCheckEvery, tailMaxRecords
	// and tailReaders.readHook, as they were when it started.
	idle, check time.Duration
	maxRecords  int
	hook        func(topic string, partition int32)

	mu      sync.Mutex
	stopped bool
	start   int64       // the first offset it holds
	next    int64       // the next offset it reads
	lso, hw int64       // the log start and high watermark its last read saw
	held    heldRecords // the records from start to next (tail_held.go)
	bytes   int
	changed chan struct{} // closed (and replaced) when it read something new or stopped

	// poll (cap 1) asks for a read now: the safety-net poll of a fetch waiting on r
	// (fetchFromTails), at the log's long poll's intervals.
	poll chan struct{}
}

// begin lets readers start, on ctx's values (they end with stopAll).
func (t *tailReaders) begin(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	t.byPart = map[partKey]*tailReader{}
}

// stopAll stops every reader and waits for their goroutines; no reader starts after.
func (t *tailReaders) stopAll() {
	t.mu.Lock()
	cancel := t.cancel
	t.ctx, t.cancel = nil, nil
	readers := t.byPart
	t.byPart = nil
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, r := range readers {
		r.stop()
	}
	t.wg.Wait()
}

// get returns the running reader of k, or nil.
func (t *tailReaders) get(k partKey) *tailReader {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off {
		return nil
	}
	return t.byPart[k]
}

// drop stops the readers of topic's partitions (all of them when partitions is
// empty): its records changed under them (DeleteTopics, CreateTopics, DeleteRecords
// on this instance). The next fetch reads the log, and starts a reader again.
func (t *tailReaders) drop(topic string, partitions ...int32) {
	t.mu.Lock()
	var out []*tailReader
	for k, r := range t.byPart {
		if k.topic == topic && (len(partitions) == 0 || slices.Contains(partitions, k.partition)) {
			delete(t.byPart, k)
			out = append(out, r)
		}
	}
	t.mu.Unlock()
	for _, r := range out {
		r.stop()
	}
}

// count returns the number of readers.
func (t *tailReaders) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byPart)
}

// ensureTail starts the reader of k at offset from (holding nothing yet), with the
// log start lso and high watermark hw a fetch saw, unless there is one, the Server is
// not serving, or it has tailMaxReaders.
func (s *Server) ensureTail(k partKey, from, lso, hw int64) {
	t := &s.tails
	if s.cfg.Wakeups == nil {
		return // it reads on the wake-ups: without them, the fetches read
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off || t.ctx == nil || t.byPart[k] != nil || len(t.byPart) >= tailMaxReaders {
		return
	}
	ctx, cancel := context.WithCancel(context.WithValue(t.ctx, tailReadKey{}, k))
	r := &tailReader{t: t, key: k, ctx: ctx, cancel: cancel, start: from, next: from, lso: lso, hw: hw, changed: make(chan struct{}), poll: make(chan struct{}, 1),
		idle: cmp.Or(t.idle, tailIdle), check: cmp.Or(t.check, tailCheckEvery), maxRecords: cmp.Or(t.maxRecords, tailMaxRecords),
		hook: t.readHook}
	r.used.Store(time.Now().UnixNano())
	t.byPart[k] = r
	t.wg.Add(1)
	t.running.Add(1)
	go s.runTail(r) // owner: the Server's tailReaders; ends with r.ctx (stop, stopAll) or on its own; stopAll waits for it
}

// stop ends r: it no longer answers fetches (those waiting on it read the log), and
// its goroutine ends.
func (r *tailReader) stop() {
	r.cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.stopped = true
	r.t.bytes.Add(-int64(r.bytes))
	r.held, r.bytes = heldRecords{}, 0
	close(r.changed)
}

// runTail is r's goroutine: it reads r's partition at once, then again on each
// wake-up of the partition, tailPollMin after a read that found records or a
// wake-up (doubling while reads find nothing), at least every tailCheckEvery, and at
// once again while a read finds more than it took. It stops when no fetch used r for tailIdle, when
// the stream's identity (created_at) changes, and on a read that fails or finds the
// log shorter than r holds (the stream deleted and created again, or a log start past
// r's next offset): the fetches read the log then.
func (s *Server) runTail(r *tailReader) {
	t := r.t
	defer t.wg.Done()
	defer t.running.Add(-1)
	defer func() {
		t.mu.Lock()
		if t.byPart[r.key] == r {
			delete(t.byPart, r.key)
		}
		t.mu.Unlock()
		r.stop()
	}()
	idle, check := r.idle, r.check
	sub := s.cfg.Wakeups.SubscribePartition(r.key.topic, r.key.partition)
	defer sub.Close()
	// Its wait: a wake-up, its own poll, or the poll of a fetch waiting on it.
	w, err := wakeup.NewWaiter(sub, &wakeup.PollOpts{MinInterval: min(tailPollMin, check), MaxInterval: check})
	if err != nil {
		return
	}
	ctx := r.ctx
	// The stream's identity, read from its row alone: DescribeStreamTx also reads every
	// partition's head, each second per reader (a topic's readers read its heads
	// partitions² times a second).
	created, err := streams.StreamCreatedAtTx(ctx, s.pool, r.key.topic)
	if err != nil {
		return
	}
	checked := time.Now()
	for {
		found, more, ok := s.readTail(ctx, r)
		if !ok {
			return
		}
		if found {
			w.Reset()
		}
		if time.Since(time.Unix(0, r.used.Load())) > idle {
			return
		}
		if time.Since(checked) >= check {
			at, err := streams.StreamCreatedAtTx(ctx, s.pool, r.key.topic)
			if err != nil || !at.Equal(created) {
				return
			}
			checked = time.Now()
		}
		if more {
			continue
		}
		w.WaitOr(ctx, r.poll)
		if ctx.Err() != nil {
			return
		}
	}
}

// readTail reads r's partition from its next offset and keeps what it read; it
// reports whether the read found records, whether there is more to read at once, and
// false ok when r must stop.
func (s *Server) readTail(ctx context.Context, r *tailReader) (found, more, ok bool) {
	r.mu.Lock()
	from := r.next
	r.mu.Unlock()
	if h := r.hook; h != nil {
		h(r.key.topic, r.key.partition)
	}
	res, err := streams.FetchTx(ctx, s.pool, r.key.topic, r.key.partition, from,
		&streams.FetchOpts{MaxBytes: tailMaxBytes / 4, MaxRecords: fetchMaxRecords})
	if err != nil {
		return false, false, false // out of range (the log moved past it, or is shorter), gone, or failed
	}
	ownPayloads(res.Events)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.next != from || res.HighWatermark < r.hw || res.HighWatermark < from {
		return false, false, false
	}
	changed := res.HighWatermark != r.hw || res.LogStartOffset != r.lso || len(res.Events) > 0
	added := 0
	last := from - 1
	if r.held.len() > 0 {
		last = max(last, r.held.last().Offset)
	}
	for i := range res.Events {
		if res.Events[i].Offset <= last {
			return false, false, false // not in offset order past from: never serve it
		}
		last = res.Events[i].Offset
	}
	for i := range res.Events {
		sz := heldSize(&res.Events[i])
		r.held.push(&res.Events[i], sz)
		added += sz
	}
	r.bytes += added
	r.t.bytes.Add(int64(added))
	r.next = res.NextOffset
	if len(res.Events) == 0 {
		// Nothing stored from `from` up to the high watermark of the same snapshot.
		r.next = res.HighWatermark
	}
	r.lso, r.hw = res.LogStartOffset, res.HighWatermark
	// Below the log start nothing is served; the bounds drop the oldest.
	// This read's records stay when the total is past its bound. Dropping copies
	// nothing: a block goes with its last record (tail_held.go).
	for r.held.len() > 0 {
		e := r.held.first()
		if !(e.Offset < r.lso || r.bytes > tailMaxBytes || r.held.len() > r.maxRecords ||
			r.held.len() > len(res.Events) && r.t.bytes.Load() > tailTotalBytes) {
			break
		}
		sz := heldSize(e)
		r.bytes -= sz
		r.t.bytes.Add(-int64(sz))
		r.start = e.Offset + 1
		r.held.dropFirst()
	}
	if r.start < r.lso {
		r.start = min(r.lso, r.next)
	}
	if changed {
		close(r.changed)
		r.changed = make(chan struct{})
	}
	return len(res.Events) > 0, res.NextOffset < res.HighWatermark && len(res.Events) > 0, true
}

// heldSize is what the bounds count for a record a reader holds.
func heldSize(e *streams.Event) int { return e.Size() + tailRecordOverhead }

// ownPayloads copies the payloads of evs (Data, Bytes, KeyBytes) into one buffer of
// their size, nil and empty kept apart (a null value is a tombstone). The fetch
// decoder keeps a read's payloads in a buffer of at least 1 KiB (64 KiB before
// session 14), which a reader that holds the records of many small reads (a read per
// wake-up, at the tail) kept whole for each of them: that buffer per record where the
// bounds count its payload.
func ownPayloads(evs []streams.Event) {
	n := 0
	for i := range evs {
		n += len(evs[i].Data) + len(evs[i].Bytes) + len(evs[i].KeyBytes)
	}
	buf := make([]byte, 0, n)
	own := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		start := len(buf)
		buf = append(buf, b...)
		return buf[start:len(buf):len(buf)]
	}
	for i := range evs {
		e := &evs[i]
		e.Data, e.Bytes, e.KeyBytes = own(e.Data), own(e.Bytes), own(e.KeyBytes)
	}
}

// serve returns the records r holds from offset (at most maxBytes of payload, at
// least one record, at most fetchMaxRecords), its watermarks, and the channel closed
// when it reads something new; ok is false when r does not hold offset (below what
// it holds or the log start, past its next offset, or stopped).
func (r *tailReader) serve(offset int64, maxBytes int) (evs []streams.Event, lso, hw int64, changed <-chan struct{}, ok bool) {
	r.used.Store(time.Now().UnixNano())
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || offset < r.start || offset < r.lso || offset > r.next {
		return nil, 0, 0, nil, false
	}
	// The slice's events are never written again (reads append past them in their
	// block; the bounds drop a block with its last record, or copy the first block's
	// kept records into a new one; records across blocks are a copy), so it is the
	// fetch's without a copy.
	return r.held.span(offset, maxBytes, fetchMaxRecords), r.lso, r.hw, r.changed, true
}

// fetchFromTails answers req from the tail readers when every partition it may read
// has a reader holding its offset: records from memory, and at the readers' next
// offsets a long poll on their signals (max.wait, min.bytes, as fetchOnce's). It
// reports false, with resp to be rebuilt, when a partition has no such reader, then
// or while it waits (a reader stopped, or the client asks below what it holds): the
// log is read then, as without readers. The partitions the principal may not read
// are refused as fetchOnce refuses them: a reader is used only below that decision.
func (s *Server) fetchFromTails(ctx context.Context, c *conn, req *kmsg.FetchRequest, resp *kmsg.FetchResponse,
	allowed *access.Decisions, deadline time.Time, longPoll bool) (bool, error) {
	if s.cfg.Wakeups == nil {
		return false, nil
	}
	jobs := fetchSkeleton(req, resp, allowed)
	if len(jobs) == 0 {
		return false, nil
	}
	readers := make([]*tailReader, len(jobs))
	missing := false
	for i, j := range jobs {
		if readers[i] = s.tails.get(partKey{j.topic, j.partition.Partition}); readers[i] == nil {
			missing = true
		} else {
			readers[i].used.Store(time.Now().UnixNano()) // a fetch asks for it: not idle, even when it is not used this time
		}
	}
	if missing {
		return false, nil
	}
	maxBytes := int(req.MaxBytes)
	if maxBytes <= 0 {
		maxBytes = 50 << 20
	}
	codecs := map[string]int8{}
	for _, j := range jobs {
		if _, ok := codecs[j.topic]; !ok {
			codec := s.fetchCodec(ctx, j.topic)
			if codec == codecZstd && req.Version < 10 {
				codec = codecNone // zstd needs Fetch v10+ (KIP-110)
			}
			codecs[j.topic] = codec
		}
	}
	waiting := false
	defer func() {
		if waiting {
			s.fetchesWaiting.Add(-1)
		}
	}()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// The safety-net poll of the log's long poll (handleFetch), here: at each of its
	// intervals the readers read. Without it, a fetch waiting on readers saw a commit
	// no wake-up named (the tailer down or polling only, a wake-up lost) only at a
	// reader's own poll, a second apart, where the log's long poll reads after 5 ms,
	// then 10, 20...
	pollOpts := &wakeup.PollOpts{MinInterval: 5 * time.Millisecond, MaxInterval: time.Second}
	if s.fetchPoll != nil {
		pollOpts = s.fetchPoll
	}
	polls := backoff.New(pollOpts.MinInterval, pollOpts.MaxInterval)
	var pollTimer *time.Timer
	defer func() {
		if pollTimer != nil {
			pollTimer.Stop()
		}
	}()
	cases := make([]reflect.SelectCase, 0, len(jobs)+4)
	for {
		total := 0
		cases = cases[:0]
		for i, j := range jobs {
			p := j.partition
			codec := codecs[j.topic]
			limit := min(int(p.PartitionMaxBytes), maxBytes-total)
			readBytes := max(limit, 1)
			if codec != codecNone {
				readBytes = compressedReadBytes(readBytes)
			}
			evs, lso, hw, changed, ok := readers[i].serve(p.FetchOffset, readBytes)
			if !ok {
				return false, nil
			}
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(changed)})
			rp := j.rp
			rp.ErrorCode = 0
			rp.RecordBatches = []byte{}
			if limit <= 0 && total > 0 {
				evs = nil // fetch.max.bytes: the partitions past it are answered empty
			}
			n := fillPartition(rp, &streams.FetchResult{Events: evs, LogStartOffset: lso, HighWatermark: hw}, nil, codec, max(limit, 1))
			if n > 0 && total > 0 && n > maxBytes-total {
				rp.RecordBatches = []byte{}
				n = 0
			}
			total += n
		}
		if !longPoll || total >= max(int(req.MinBytes), 1) || c.draining.Err() != nil || !time.Now().Before(deadline) {
			s.tails.answered.Add(1)
			return true, nil
		}
		if !waiting {
			waiting = true
			s.fetchesWaiting.Add(1)
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
			pollTimer = time.NewTimer(polls.Next())
		}
		cases = append(cases,
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.draining.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(pollTimer.C)})
		chosen, _, _ := reflect.Select(cases)
		switch chosen {
		case len(jobs):
			return false, ctx.Err() // the client went away
		case len(jobs) + 2:
			deadline = time.Now() // answer what there is
		case len(jobs) + 3:
			for _, r := range readers {
				select {
				case r.poll <- struct{}{}:
				default: // asked already
				}
			}
			pollTimer.Reset(polls.Next())
		}
	}
}

// startTails starts the readers of the partitions resp answered without error at or
// near their log end (tailStartLag), from the offsets req asked for.
func (s *Server) startTails(req *kmsg.FetchRequest, resp *kmsg.FetchResponse) {
	if s.cfg.Wakeups == nil || len(resp.Topics) != len(req.Topics) {
		return
	}
	for ti, t := range resp.Topics {
		rt := req.Topics[ti]
		if rt.Topic == "" || rt.Topic == consumerOffsetsTopic || len(t.Partitions) != len(rt.Partitions) {
			continue
		}
		for pi, p := range t.Partitions {
			if p.ErrorCode != 0 || p.HighWatermark < 0 || p.HighWatermark-rt.Partitions[pi].FetchOffset > tailStartLag {
				continue
			}
			if from := rt.Partitions[pi].FetchOffset; from >= p.LogStartOffset && from <= p.HighWatermark {
				s.ensureTail(partKey{rt.Topic, p.Partition}, from, p.LogStartOffset, p.HighWatermark)
			}
		}
	}
}

// fetchSkeleton sets resp's topics and partitions as req names them, with no records
// and unknown watermarks, answers those the fetch does not read (an unknown topic
// id, the internal offsets topic, a topic the principal may not read), and returns
// the others.
func fetchSkeleton(req *kmsg.FetchRequest, resp *kmsg.FetchResponse, allowed *access.Decisions) []fetchJob {
	resp.Topics = resp.Topics[:0]
	var jobs []fetchJob
	for _, t := range req.Topics {
		rt := kmsg.NewFetchResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		rt.Partitions = make([]kmsg.FetchResponseTopicPartition, len(t.Partitions))
		resp.Topics = append(resp.Topics, rt)
	}
	for ti, t := range req.Topics {
		for pi, p := range t.Partitions {
			rp := &resp.Topics[ti].Partitions[pi]
			*rp = kmsg.NewFetchResponseTopicPartition()
			rp.Partition = p.Partition
			rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = -1, -1, -1
			rp.PreferredReadReplica = -1
			rp.RecordBatches = []byte{} // empty, not null: librdkafka refuses a null record set
			// v13+: an id no stream has.
			if t.Topic == "" {
				rp.ErrorCode = kerr.UnknownTopicID.Code
				continue
			}
			if t.Topic == consumerOffsetsTopic {
				fetchInternal(rp, p)
				continue
			}
			if !allowed.Allows(t.Topic, access.Read) {
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				continue
			}
			jobs = append(jobs, fetchJob{rp: rp, topic: t.Topic, partition: p})
		}
	}
	return jobs
}
