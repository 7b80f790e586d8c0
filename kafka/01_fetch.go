package kafka

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// Fetch v4 to v16: v13+ names topics by id (KIP-516), resolved through the ids
// Metadata hands out (topicID, derived from the name); an id no stream has is
// UNKNOWN_TOPIC_ID. Fetch sessions (v7+) are declined (session id 0): clients send
// full fetches.
var fetchHandler = handler{key: 1, min: 4, max: 16, fn: handleFetch}

const (
	// fetchParallelism bounds the partition reads of one connection at once (those
	// a Fetch left running for the next included).
	fetchParallelism = 4
	// fetchMaxRecords bounds the records read from one partition per Fetch.
	fetchMaxRecords = 5000
)

func handleFetch(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.FetchRequest)
	resp := req.ResponseKind().(*kmsg.FetchResponse)
	s := r.s
	if req.SessionID != 0 || req.SessionEpoch > 0 {
		// We never hand out a session id, so an incremental fetch names one we do
		// not know.
		resp.ErrorCode = kerr.FetchSessionIDNotFound.Code
		return resp, nil
	}

	if req.Version >= 13 {
		if err := s.resolveTopicIDs(ctx, req); err != nil {
			return nil, err
		}
	}
	var names []string
	for _, t := range req.Topics {
		if t.Topic != "" {
			names = append(names, t.Topic)
		}
	}
	allowed, err := r.decide(ctx, names)
	if err != nil {
		return nil, err
	}
	maxWait := time.Duration(req.MaxWaitMillis) * time.Millisecond
	longPoll := maxWait > 0 && req.MinBytes > 0
	var sub *wakeup.Subscription // nil: the long poll only polls
	if longPoll && s.cfg.Wakeups != nil {
		// Subscribe before the first read, so a commit between it and the wait still
		// ends the wait.
		sub = s.cfg.Wakeups.SubscribeStreams(names...)
		defer sub.Close()
	}
	opts := &wakeup.PollOpts{MinInterval: 5 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	if sub != nil {
		opts.MaxInterval = time.Second // the wake-ups carry it; polling is the safety net
	}
	if s.fetchPoll != nil {
		opts = s.fetchPoll
	}
	// The server's drain (shutdown) answers a waiting fetch at once.
	pollCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.c.draining, cancel)()
	waiting := false
	defer func() {
		if waiting {
			s.fetchesWaiting.Add(-1)
		}
	}()
	first := true
	deadline := time.Now().Add(maxWait)
	err = wakeup.Poll(pollCtx, sub, deadline, opts, func() (bool, error) {
		// The first pass reads every partition; a pass after a wake-up that named
		// partitions reads only those of them the request has (the others' answers
		// stand: nothing woke them), without the head-row read before it. A pass
		// after the safety-net poll's timeout, or a wake-up that named none, reads
		// everything again.
		var woken map[string][]int32
		if !first && sub != nil {
			if w, all := sub.Woken(); !all {
				woken = w
			}
		}
		first = false
		got, failed := s.fetchOnce(ctx, r.c, req, resp, allowed, woken, sub, deadline)
		if err := ctx.Err(); err != nil {
			return false, err // the client went away
		}
		// A partition's error ends the wait, as Kafka answers at once: waiting would
		// not change it.
		done := !longPoll || got >= int(req.MinBytes) || failed || r.c.draining.Err() != nil
		if !done && !waiting {
			waiting = true
			s.fetchesWaiting.Add(1)
		}
		return done, nil
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil && pollCtx.Err() == nil {
		return nil, err
	}
	return resp, nil // enough bytes, the deadline, or the drain
}

// fetchJob is one partition a fetch pass reads into rp.
type fetchJob struct {
	rp        *kmsg.FetchResponseTopicPartition
	topic     string
	partition kmsg.FetchRequestTopicPartition
	// stashed is the read the connection's previous fetch left running for it (nil:
	// read it).
	stashed *stashedRead
}

// fetchOnce reads the partitions of req into resp and returns the record bytes resp
// holds and whether a partition failed. With woken nil it reads every partition
// (replacing what a previous pass put there); otherwise only the partitions woken
// names (by topic) that a previous pass of resp read, reading each directly, the
// others' answers left as they were. Partitions of topics the principal may not
// read are TOPIC_AUTHORIZATION_FAILED. With sub, the pass also reads the partitions
// woken while it runs (runFetchJobs), until deadline.
func (s *Server) fetchOnce(ctx context.Context, c *conn, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, allowed *access.Decisions,
	woken map[string][]int32, sub *wakeup.Subscription, deadline time.Time) (int, bool) {
	if len(woken) > 0 && len(resp.Topics) == len(req.Topics) {
		return s.fetchWoken(ctx, c, req, resp, woken, sub, deadline)
	}
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
	readable := readableJobs(jobs)
	// A read the connection's previous fetch left running, at the offset asked for,
	// is this pass's read of that partition (fetchPass); the others' heads first.
	stashed, rest := c.stash.take(jobs)
	jobs = append(stashed, s.skipUnchanged(ctx, rest)...)
	return s.runFetchJobs(ctx, c, req, resp, jobs, 0, &fetchWatch{sub: sub, readable: readable, deadline: deadline})
}

// partKey names one partition of a fetch.
type partKey struct {
	topic     string
	partition int32
}

// readableJobs indexes jobs by partition.
func readableJobs(jobs []fetchJob) map[partKey]fetchJob {
	out := make(map[partKey]fetchJob, len(jobs))
	for _, j := range jobs {
		out[partKey{j.topic, j.partition.Partition}] = j
	}
	return out
}

// fetchWoken is fetchOnce's pass after a wake-up: it reads again the partitions of
// resp that woken names and that a previous pass read without error (those it did
// not read, internal, refused or unknown, keep their answer).
func (s *Server) fetchWoken(ctx context.Context, c *conn, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, woken map[string][]int32,
	sub *wakeup.Subscription, deadline time.Time) (int, bool) {
	var jobs []fetchJob
	readable := map[partKey]fetchJob{}
	held := 0
	for ti, t := range req.Topics {
		parts := woken[t.Topic]
		for pi, p := range t.Partitions {
			rp := &resp.Topics[ti].Partitions[pi]
			if t.Topic == "" || t.Topic == consumerOffsetsTopic || rp.ErrorCode != 0 {
				held += len(rp.RecordBatches)
				continue
			}
			j := fetchJob{rp: rp, topic: t.Topic, partition: p}
			readable[partKey{t.Topic, p.Partition}] = j
			if !slices.Contains(parts, p.Partition) {
				held += len(rp.RecordBatches)
				continue
			}
			rp.RecordBatches = []byte{}
			jobs = append(jobs, j)
		}
	}
	return s.runFetchJobs(ctx, c, req, resp, jobs, held, &fetchWatch{sub: sub, readable: readable, deadline: deadline})
}

// fetchWatch is what a pass watches while it reads: the fetch's wake-ups (nil: none),
// the partitions it may read again (those of resp without an error, by partition),
// and the fetch's deadline.
type fetchWatch struct {
	sub      *wakeup.Subscription
	readable map[partKey]fetchJob
	deadline time.Time
}

// runFetchJobs reads jobs into their partitions of resp, at most fetchParallelism at
// once, within the request's byte bound less held (what resp already holds), and
// returns the record bytes resp holds and whether a partition of it failed.
//
// Kafka clients keep one fetch in flight per broker, and an instance is one broker:
// a fetch reads every partition a client has here. So that a partition's records do
// not wait for the reads of the others (the native consumer's partition workers read
// independently), the pass answers as soon as it holds min.bytes, and each read
// still running then goes on into the connection's stash, where the next fetch of
// that partition at that offset finds it (a read that found nothing is dropped
// there: the next fetch reads again). Until it answers, a wake-up for a partition
// of w.readable starts its read at once (one being read is read again after that
// read, if it found nothing): a record whose partition wakes while the pass reads
// another does not wait for that read, the response and the client's next fetch.
func (s *Server) runFetchJobs(ctx context.Context, c *conn, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, jobs []fetchJob, held int, w *fetchWatch) (int, bool) {
	maxBytes := int(req.MaxBytes)
	if maxBytes <= 0 {
		maxBytes = 50 << 20
	}
	p := &fetchPass{s: s, ctx: ctx, c: c, req: req, maxBytes: maxBytes, total: held,
		minBytes: max(int(req.MinBytes), 1), deadline: w.deadline,
		idle: make(chan struct{}, 1), reading: map[partKey]*stashedRead{}, again: map[partKey]bool{}}
	p.mu.Lock()
	for _, j := range jobs {
		p.start(j)
	}
	p.mu.Unlock()
	var wake <-chan struct{}
	if w.sub != nil && len(w.readable) > 0 {
		wake = w.sub.C
	}
	for {
		p.mu.Lock()
		if len(p.reading) == 0 || p.total >= p.minBytes || ctx.Err() != nil {
			p.end()
			p.mu.Unlock()
			break
		}
		p.mu.Unlock()
		select {
		case <-p.idle:
		case <-ctx.Done():
		case <-wake:
			byStream, all := w.sub.Woken()
			p.mu.Lock()
			for k, j := range w.readable {
				if all || slices.Contains(byStream[k.topic], k.partition) {
					p.woken(k, j)
				}
			}
			p.mu.Unlock()
		}
	}
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			if rp.ErrorCode != 0 {
				return p.total, true
			}
		}
	}
	return p.total, false
}

// fetchPass is one pass's reads (runFetchJobs). mu guards the fields below it; a
// read writes into a partition of the response only under mu, before the pass ends.
type fetchPass struct {
	s        *Server
	ctx      context.Context
	c        *conn
	req      *kmsg.FetchRequest
	maxBytes int
	minBytes int
	deadline time.Time
	idle     chan struct{} // cap 1: a read ended

	mu      sync.Mutex
	total   int                      // record bytes the response holds
	reading map[partKey]*stashedRead // the reads under way
	jobs    map[partKey]fetchJob     // their jobs
	again   map[partKey]bool         // woken while being read: read again if that read found nothing
	ended   bool                     // the pass answered: a read that ends now goes to the stash
}

// end ends the pass (mu held): the reads under way go on into the connection's
// stash; their partitions are answered without records, at the offset asked for
// (the high watermark a previous pass of this fetch read, when there was one).
func (p *fetchPass) end() {
	p.ended = true
	for k, sr := range p.reading {
		j := p.jobs[k]
		if j.rp.HighWatermark < 0 {
			j.rp.HighWatermark, j.rp.LastStableOffset = j.partition.FetchOffset, j.partition.FetchOffset
		}
		p.c.stash.put(k, sr)
	}
}

// woken starts the read of a partition woken during the pass, or marks it to be
// read again when it is being read (mu held).
func (p *fetchPass) woken(k partKey, j fetchJob) {
	if p.ended || p.total >= p.minBytes || !time.Now().Before(p.deadline) {
		return
	}
	if p.reading[k] != nil {
		p.again[k] = true
		return
	}
	if len(j.rp.RecordBatches) > 0 {
		return // it has records in this response already; the next fetch reads on from them
	}
	p.start(j)
}

// start reads j in a goroutine of its own, or waits for the stashed read j.stashed
// (mu held).
func (p *fetchPass) start(j fetchJob) {
	k := partKey{j.topic, j.partition.Partition}
	sr := j.stashed
	j.stashed = nil
	if sr == nil {
		sr = &stashedRead{offset: j.partition.FetchOffset, done: make(chan struct{})}
		go p.read(j, sr) // owner: the pass, then the stash; ends with the read, under the connection's ctx
	}
	if p.jobs == nil {
		p.jobs = map[partKey]fetchJob{}
	}
	p.reading[k], p.jobs[k] = sr, j
	go func() { // owner: runFetchJobs; ends when the read does or the pass ended
		select {
		case <-sr.done:
		case <-p.ctx.Done():
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.ended || p.reading[k] != sr {
			return // in the stash now
		}
		delete(p.reading, k)
		n := sr.n
		*j.rp = sr.rp
		p.total += n
		if p.again[k] {
			delete(p.again, k)
			if n == 0 && sr.rp.ErrorCode == 0 && p.total < p.minBytes && time.Now().Before(p.deadline) {
				p.start(j)
			}
		}
		select {
		case p.idle <- struct{}{}:
		default:
		}
	}()
}

// read reads one partition into sr, within the room the response had left when it
// started, at most fetchParallelism reads of the server at once per connection.
func (p *fetchPass) read(j fetchJob, sr *stashedRead) {
	defer close(sr.done)
	p.c.fetchSem <- struct{}{}
	defer func() { <-p.c.fetchSem }()
	if h := p.s.fetchReadHook; h != nil {
		h(j.topic, j.partition.Partition)
	}
	p.mu.Lock()
	room := p.maxBytes - p.total
	p.mu.Unlock()
	rp := kmsg.NewFetchResponseTopicPartition()
	rp.Partition = j.partition.Partition
	rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = -1, -1, -1
	rp.PreferredReadReplica = -1
	rp.RecordBatches = []byte{}
	if room <= 0 {
		// Kafka's fetch.max.bytes: the partitions past it are answered empty.
		p.s.fillHead(p.c.ctx, &rp, j.topic, j.partition.Partition)
		sr.rp = rp
		return
	}
	limit := min(int(j.partition.PartitionMaxBytes), room)
	codec := p.s.fetchCodec(p.c.ctx, j.topic)
	if codec == codecZstd && p.req.Version < 10 {
		codec = codecNone // zstd needs Fetch v10+ (KIP-110): an older client gets the records uncompressed
	}
	sr.n = p.s.fetchPartition(p.c.ctx, &rp, j.topic, j.partition.Partition, j.partition.FetchOffset, limit, codec)
	sr.rp = rp
}

// stashedRead is one partition's read: its result once done is closed.
type stashedRead struct {
	offset int64
	done   chan struct{}
	rp     kmsg.FetchResponseTopicPartition
	n      int
}

// fetchStash holds, by partition, the reads a connection's fetch left running when
// it answered, for the connection's next fetch of that partition.
type fetchStash struct {
	mu    sync.Mutex
	reads map[partKey]*stashedRead
}

func (st *fetchStash) put(k partKey, sr *stashedRead) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.reads == nil {
		st.reads = map[partKey]*stashedRead{}
	}
	st.reads[k] = sr
}

// take empties the stash and returns the jobs whose partition has a read there at
// the offset they ask for, holding it (stashed), and the other jobs. A read done
// that found no records is not used: the next pass reads again, as a wake-up for a
// record committed after it may have gone to the fetch that left it.
func (st *fetchStash) take(jobs []fetchJob) (stashed, rest []fetchJob) {
	st.mu.Lock()
	reads := st.reads
	st.reads = nil
	st.mu.Unlock()
	for _, j := range jobs {
		sr := reads[partKey{j.topic, j.partition.Partition}]
		if sr != nil && sr.offset == j.partition.FetchOffset {
			select {
			case <-sr.done:
				if sr.n == 0 {
					sr = nil
				}
			default:
			}
		} else {
			sr = nil
		}
		if sr != nil {
			j.stashed = sr
			stashed = append(stashed, j)
		} else {
			rest = append(rest, j)
		}
	}
	return stashed, rest
}

// skipUnchanged drops the jobs of partitions with nothing at their fetch offset (it
// is the log end), answering them from their head rows: one read of a topic's heads
// instead of a read of each partition, when a fetch names several partitions of a
// topic. A long poll reads again on every wake-up, usually for one partition's new
// records; reading all of them made each pass cost one query per partition. A topic
// whose heads cannot be read is read partition by partition, which reports why.
func (s *Server) skipUnchanged(ctx context.Context, jobs []fetchJob) []fetchJob {
	perTopic := map[string]int{}
	for _, j := range jobs {
		perTopic[j.topic]++
	}
	heads := map[string][]streams.PartitionInfo{}
	for t, n := range perTopic {
		if n < 2 {
			continue
		}
		if h, err := s.streams.PartitionHeads(ctx, t); err == nil {
			heads[t] = h
		}
	}
	if len(heads) == 0 {
		return jobs
	}
	kept := jobs[:0]
	for _, j := range jobs {
		p, offset, rp := j.partition.Partition, j.partition.FetchOffset, j.rp
		h := heads[j.topic]
		if p >= 0 && int(p) < len(h) && h[p].Partition == p && offset == h[p].NextOffset && offset >= h[p].LogStartOffset {
			rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = h[p].NextOffset, h[p].NextOffset, h[p].LogStartOffset
			continue
		}
		kept = append(kept, j)
	}
	return kept
}

// fetchPartition reads one partition from offset into rp, its batches compressed
// with codec, and returns the bytes of the record batches.
func (s *Server) fetchPartition(ctx context.Context, rp *kmsg.FetchResponseTopicPartition, topic string, partition int32, offset int64, maxBytes int, codec int8) int {
	readBytes := maxBytes
	if codec != codecNone {
		readBytes = compressedReadBytes(maxBytes)
	}
	res, err := streams.FetchTx(ctx, s.pool, topic, partition, offset, &streams.FetchOpts{
		MaxBytes: max(readBytes, 1), MaxRecords: fetchMaxRecords})
	if err != nil {
		var oor *streams.OffsetOutOfRangeError
		if errors.As(err, &oor) {
			rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = oor.NextOffset, oor.NextOffset, oor.LogStartOffset
		}
		rp.ErrorCode = errorCode(err)
		return 0
	}
	rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = res.HighWatermark, res.HighWatermark, res.LogStartOffset
	if len(res.Events) == 0 {
		return 0
	}
	if codec != codecNone {
		rp.RecordBatches = appendCompressedBatches(nil, res.Events, codec, maxBytes)
	} else {
		rp.RecordBatches = appendBatches(nil, res.Events)
	}
	return len(rp.RecordBatches)
}

// fillHead sets a partition's watermarks without reading records.
func (s *Server) fillHead(ctx context.Context, rp *kmsg.FetchResponseTopicPartition, topic string, partition int32) {
	res, err := streams.FetchTx(ctx, s.pool, topic, partition, 0, &streams.FetchOpts{MaxRecords: 1, MaxBytes: 1})
	var oor *streams.OffsetOutOfRangeError
	switch {
	case errors.As(err, &oor):
		rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = oor.NextOffset, oor.NextOffset, oor.LogStartOffset
	case err != nil:
		rp.ErrorCode = errorCode(err)
	default:
		rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = res.HighWatermark, res.HighWatermark, res.LogStartOffset
	}
}

// resolveTopicIDs names the topics of a v13+ request, which names them by id, from
// the ids of the streams (cached; reloaded when an id is not in the cache, so a new
// topic is found). A topic whose id no stream has keeps an empty name.
func (s *Server) resolveTopicIDs(ctx context.Context, req *kmsg.FetchRequest) error {
	s.topicIDs.mu.Lock()
	defer s.topicIDs.mu.Unlock()
	for reloaded := false; ; reloaded = true {
		missing := false
		for i := range req.Topics {
			t := &req.Topics[i]
			name, ok := s.topicIDs.names[t.TopicID]
			t.Topic = name
			missing = missing || !ok
		}
		if !missing || reloaded {
			return nil
		}
		names, err := s.topicNamesByID(ctx)
		if err != nil {
			return err
		}
		s.topicIDs.names = names
	}
}
