package kafka

import (
	"context"
	"errors"
	"maps"
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
	// fetchParallelism bounds the partition reads of their own of one connection at
	// once (those a Fetch left running for the next included; readTopics' one
	// statement per topic takes no slot).
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
	deadline := time.Now().Add(maxWait)
	// The tail readers answer when they hold every partition's offset (tail.go);
	// otherwise, or once one of them stops, the fetch reads the log.
	if ok, err := s.fetchFromTails(ctx, r.c, req, resp, allowed, deadline, longPoll); err != nil {
		return nil, err
	} else if ok {
		r.c.stash.noteAnswer(resp)
		return resp, nil
	}
	s.tails.read.Add(1)
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
	r.c.stash.noteAnswer(resp)
	s.startTails(req, resp)
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
	jobs := fetchSkeleton(req, resp, allowed)
	readable := readableJobs(jobs)
	jobs = s.readTopics(ctx, c, req, jobs)
	return s.runFetchJobs(ctx, c, req, resp, jobs, 0, &fetchWatch{sub: sub, readable: readable, deadline: deadline})
}

// topicRead is one statement of readTopics: the partitions of jobs it reads (by
// index in jobs), how, and what it read.
type topicRead struct {
	topic    string
	idx      []int
	reads    []streams.PartitionRead
	limits   []int // the record bytes each partition's batches may take
	codec    int8
	headOnly bool // a partition's stashed read waits for this statement's head row
	res      []streams.PartitionFetch
	err      error
}

// readTopics is the first pass's read of the partitions the connection's last answer
// left at their log end (as far as it knew: a partition it never answered counts):
// ONE statement per topic (streams.FetchPartitionsTx) reads all of them, each from
// the offset asked for, with its watermarks from the same snapshot. A partition with
// records known to be there (the client asks for an offset below the high watermark
// the connection last answered for it: a backlog) is read on its own, at once, as
// before, its read kept in the stash if the pass answers first; a partition with a
// read in the stash at that offset gets only its head row in the statement, which
// take checks that read against (usableFor). A statement with no such head row runs
// beside the pass's other reads, its partitions' jobs waiting for it (a read each,
// readTopics's own: fresh); one with a head row runs first, as take needs it.
//
// It replaced a read of the head rows of every topic of several partitions (to
// answer those at their log end without reading them) followed by a read of each
// other partition: two round trips before the first records of a consumer that
// keeps up, the head read at 0.27 / 7.2 ms p50 / p99 in the kafka11 trace.
func (s *Server) readTopics(ctx context.Context, c *conn, req *kmsg.FetchRequest, jobs []fetchJob) []fetchJob {
	inStash, lastHW := c.stash.snapshot()
	maxBytes := int(req.MaxBytes)
	if maxBytes <= 0 {
		maxBytes = 50 << 20
	}
	byTopic := map[string]*topicRead{}
	var trs []*topicRead
	for i, j := range jobs {
		k := partKey{j.topic, j.partition.Partition}
		sr := inStash[k]
		stashed := sr != nil && sr.offset == j.partition.FetchOffset && !sr.endedEmpty()
		if hw, ok := lastHW[k]; ok && j.partition.FetchOffset < hw && !stashed {
			continue // a backlog: read on its own (a stashed read at another offset is cancelled by take)
		}
		tr := byTopic[j.topic]
		if tr == nil {
			tr = &topicRead{topic: j.topic, codec: s.fetchCodec(ctx, j.topic)}
			if tr.codec == codecZstd && req.Version < 10 {
				tr.codec = codecNone // zstd needs Fetch v10+ (KIP-110): an older client gets the records uncompressed
			}
			byTopic[j.topic] = tr
			trs = append(trs, tr)
		}
		tr.idx = append(tr.idx, i)
		p := j.partition
		limit := min(int(p.PartitionMaxBytes), maxBytes)
		tr.limits = append(tr.limits, limit)
		if stashed {
			tr.headOnly = true
			tr.reads = append(tr.reads, streams.PartitionRead{Partition: p.Partition, HeadOnly: true})
			continue
		}
		readBytes := limit
		if tr.codec != codecNone {
			readBytes = compressedReadBytes(limit)
		}
		tr.reads = append(tr.reads, streams.PartitionRead{Partition: p.Partition, Offset: p.FetchOffset,
			MaxBytes: max(readBytes, 1), MaxRecords: fetchMaxRecords})
	}
	// The statements' reads share fetch.max.bytes: a partition reads at most its
	// share of it (at least one record), so that what they read together stays about
	// that bound however many partitions they name (each up to its partition max
	// bytes, a consumer's first fetch of 1,000 partitions read a gigabyte for a 50 MiB
	// answer). A partition its share cut short has a backlog at the next fetch, read
	// on its own.
	n := 0
	for _, tr := range trs {
		for _, r := range tr.reads {
			if !r.HeadOnly {
				n++
			}
		}
	}
	if n > 0 {
		share := max(maxBytes/n, 1)
		for _, tr := range trs {
			shareBytes := share
			if tr.codec != codecNone {
				shareBytes = compressedReadBytes(share)
			}
			for i := range tr.reads {
				tr.reads[i].MaxBytes = min(tr.reads[i].MaxBytes, max(shareBytes, 1))
			}
		}
	}
	// The statements with a head row for take run first (at once); the others beside
	// the pass.
	var first []*topicRead
	for _, tr := range trs {
		switch {
		case tr.headOnly:
			first = append(first, tr)
		case len(tr.idx) > 1:
			s.readTopicBeside(c, jobs, tr)
		}
		// A topic with one partition to read: its job reads it (FetchTx, one statement
		// too).
	}
	var wg sync.WaitGroup
	for n, tr := range first {
		run := func() { tr.res, tr.err = streams.FetchPartitionsTx(ctx, s.pool, tr.topic, tr.reads) }
		if n == len(first)-1 {
			run() // the last (usually the only) one here
			continue
		}
		wg.Add(1)
		go func() { // owner: readTopics, which waits for it
			defer wg.Done()
			run()
		}()
	}
	wg.Wait()

	heads := map[string][]streams.PartitionInfo{}
	for _, tr := range first {
		if tr.err != nil {
			continue // its partitions are read one by one, which reports why
		}
		var h []streams.PartitionInfo
		for n, pf := range tr.res {
			lso, hwm, ok := int64(0), int64(0), false
			var oor *streams.OffsetOutOfRangeError
			switch {
			case pf.Err == nil:
				lso, hwm, ok = pf.Result.LogStartOffset, pf.Result.HighWatermark, true
			case errors.As(pf.Err, &oor):
				lso, hwm, ok = oor.LogStartOffset, oor.NextOffset, true
			}
			if ok {
				for int(pf.Partition) >= len(h) {
					h = append(h, streams.PartitionInfo{Partition: -1})
				}
				h[pf.Partition] = streams.PartitionInfo{Partition: pf.Partition, LogStartOffset: lso, NextOffset: hwm}
			}
			if tr.reads[n].HeadOnly {
				continue
			}
			j := &jobs[tr.idx[n]]
			sr := newReadFor(c, *j)
			sr.n = fillPartition(&sr.rp, pf.Result, pf.Err, tr.codec, tr.limits[n])
			close(sr.done)
			j.stashed = sr
		}
		heads[tr.topic] = h
	}
	stashed, rest := c.stash.take(jobs, heads, time.Now())
	return append(stashed, rest...)
}

// newReadFor returns a read of j's partition that readTopics does (fresh: the pass
// does not read it again when it finds nothing), not done yet.
func newReadFor(c *conn, j fetchJob) *stashedRead {
	sr := &stashedRead{offset: j.partition.FetchOffset, ctx: c.ctx, cancel: func() {}, done: make(chan struct{}), started: true, fresh: true}
	sr.rp = kmsg.NewFetchResponseTopicPartition()
	sr.rp.Partition = j.partition.Partition
	sr.rp.HighWatermark, sr.rp.LastStableOffset, sr.rp.LogStartOffset = -1, -1, -1
	sr.rp.PreferredReadReplica = -1
	sr.rp.RecordBatches = []byte{}
	return sr
}

// readTopicBeside runs tr's statement in a goroutine, its partitions' jobs taking
// its reads (jobs[i].stashed, done when it returns): the pass applies each as it
// would a stashed read, the backlog's reads running meanwhile. A statement that
// fails is each partition's error. It runs on the connection's context, so a read
// the pass answers before goes on into the stash.
func (s *Server) readTopicBeside(c *conn, jobs []fetchJob, tr *topicRead) {
	// The partitions' reads end together: one done channel, closed once all are
	// filled, so that the pass never sees some of them ended and the others still
	// running (it would read head rows for those, and answer without their records).
	done := make(chan struct{})
	srs := make([]*stashedRead, len(tr.idx))
	for n, i := range tr.idx {
		srs[n] = newReadFor(c, jobs[i])
		srs[n].done = done
		jobs[i].stashed = srs[n]
	}
	s.fetchReads.Add(1)
	go func() { // owner: the pass, then the stash; ends with the statement or the connection; Serve waits for it
		defer s.fetchReads.Done()
		res, err := streams.FetchPartitionsTx(c.ctx, s.pool, tr.topic, tr.reads)
		for n, sr := range srs {
			if err != nil {
				sr.rp.ErrorCode = errorCode(err)
			} else {
				sr.n = fillPartition(&sr.rp, res[n].Result, res[n].Err, tr.codec, tr.limits[n])
			}
		}
		close(done)
	}()
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
// independently), once the pass holds min.bytes it reads the head rows of the reads
// still under way and answers when that head read returns (or every read has ended);
// a read that ends meanwhile joins the answer. Each read still under way then (at most
// fetchParallelism of its own: such a read starts only when it has one of the
// connection's slots; and readTopics' statements' partitions, which share the
// request's byte bound) goes on into the connection's stash, where the next fetch of
// that partition at that offset finds it (a read that found nothing is dropped
// there: the next fetch reads again); the reads still waiting for a slot are dropped.
// The partitions of the reads not done are answered without records, with the
// watermarks of that head read. Until it answers, a wake-up for a
// partition of w.readable starts its read (one being read is read again after that
// read, if it found nothing): a record whose partition wakes while the pass reads
// another does not wait for that read, the response and the client's next fetch.
func (s *Server) runFetchJobs(ctx context.Context, c *conn, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, jobs []fetchJob, held int, w *fetchWatch) (int, bool) {
	maxBytes := int(req.MaxBytes)
	if maxBytes <= 0 {
		maxBytes = 50 << 20
	}
	p := &fetchPass{s: s, ctx: ctx, c: c, req: req, maxBytes: maxBytes, total: held,
		minBytes: max(int(req.MinBytes), 1), deadline: w.deadline, idle: make(chan struct{}, 1), answered: make(chan struct{}),
		reading: map[partKey]*stashedRead{}, jobs: map[partKey]fetchJob{}, again: map[partKey]bool{}}
	p.mu.Lock()
	for _, j := range jobs {
		p.start(j)
	}
	p.mu.Unlock()
	var wake <-chan struct{}
	if w.sub != nil && len(w.readable) > 0 {
		wake = w.sub.C
	}
	// Once the pass holds min.bytes with reads under way, it reads the head rows of
	// their topics for the watermarks it answers them with (fillWatermarks), and
	// meanwhile still takes the reads that end: a read that ends before that head
	// read joins this response instead of waiting in the stash for the next fetch.
	var headsRead chan map[string][]streams.PartitionInfo // nil: not started
	var heads map[string][]streams.PartitionInfo          // what it read
	for {
		p.mu.Lock()
		// A read that has ended but whose watcher has not applied it yet is no reason
		// to read head rows: end applies it (the statement of readTopics ends the reads
		// of all its partitions at once).
		if len(p.reading) == 0 || ctx.Err() != nil || p.total >= p.minBytes && (heads != nil || !p.running()) {
			open := p.end()
			p.mu.Unlock()
			s.fillWatermarks(ctx, open, heads)
			break
		}
		if p.total >= p.minBytes && headsRead == nil {
			headsRead = make(chan map[string][]streams.PartitionInfo, 1)
			topics := p.readingTopics()
			s.fetchReads.Add(1)
			go func() { // owner: the pass, which waits for it or ends first (the Server waits for it)
				defer s.fetchReads.Done()
				if h := s.fetchHeadsHook; h != nil {
					h()
				}
				headsRead <- s.topicHeads(ctx, topics)
			}()
		}
		p.mu.Unlock()
		select {
		case <-p.idle:
		case heads = <-headsRead:
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
	answered chan struct{} // closed when the pass ends: a read still waiting for a slot is dropped

	mu      sync.Mutex
	total   int                      // record bytes the response holds
	reading map[partKey]*stashedRead // the reads under way or waiting for a slot
	jobs    map[partKey]fetchJob     // their jobs
	again   map[partKey]bool         // woken while being read: read again if that read found nothing
	ended   bool                     // the pass answered: a read that ends now goes to the stash
}

// end ends the pass (mu held) and returns the jobs it answers without their read. A
// read that has ended (its watcher has not had mu yet) is applied; one under way
// goes on into the connection's stash; one still waiting for a slot is dropped (the
// client's next fetch reads that partition).
func (p *fetchPass) end() (open []fetchJob) {
	p.ended = true
	close(p.answered)
	for k, sr := range p.reading {
		j := p.jobs[k]
		select {
		case <-sr.done:
			if sr.started {
				p.apply(k, j, sr)
				continue
			}
		default:
			if sr.started {
				p.c.stash.put(k, sr)
			}
		}
		open = append(open, j)
	}
	return open
}

// running reports whether a read of the pass is still under way or waiting for a
// slot (mu held).
func (p *fetchPass) running() bool {
	for _, sr := range p.reading {
		select {
		case <-sr.done:
		default:
			return true
		}
	}
	return false
}

// readingTopics returns the topics of the reads under way or waiting for a slot (mu
// held).
func (p *fetchPass) readingTopics() []string {
	var out []string
	for k := range p.reading {
		if !slices.Contains(out, k.topic) {
			out = append(out, k.topic)
		}
	}
	return out
}

// topicHeads reads the head rows of topics, one read per topic; a topic whose heads
// cannot be read maps to nil.
func (s *Server) topicHeads(ctx context.Context, topics []string) map[string][]streams.PartitionInfo {
	heads := make(map[string][]streams.PartitionInfo, len(topics))
	for _, t := range topics {
		h, err := s.streams.PartitionHeads(ctx, t)
		if err != nil {
			h = nil
		}
		heads[t] = h
	}
	return heads
}

// fillWatermarks sets the watermarks of the partitions a pass answers while their
// reads are under way (or dropped) from their head rows, read after those reads
// started (heads, or read now for a topic heads lacks, one read per topic): a high
// watermark at the offset asked for would tell the client it is at the log end
// (librdkafka's _PARTITION_EOF, a lag of 0) when the read may be about to return
// records. A topic whose heads cannot be read is read partition by partition.
func (s *Server) fillWatermarks(ctx context.Context, open []fetchJob, heads map[string][]streams.PartitionInfo) {
	if ctx.Err() != nil || len(open) == 0 {
		return // the client went away: no one reads the answer
	}
	if heads == nil {
		heads = map[string][]streams.PartitionInfo{}
	}
	for _, j := range open {
		if _, ok := heads[j.topic]; !ok {
			heads[j.topic] = s.topicHeads(ctx, []string{j.topic})[j.topic]
		}
		if hd, ok := headOf(heads, j.topic, j.partition.Partition); ok {
			j.rp.HighWatermark, j.rp.LastStableOffset, j.rp.LogStartOffset = hd.NextOffset, hd.NextOffset, hd.LogStartOffset
		} else {
			s.fillHead(ctx, j.rp, j.topic, j.partition.Partition)
		}
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

// start reads j in a goroutine of its own once it has one of the connection's
// slots, or takes the stashed read j.stashed: applied at once when it has ended,
// waited for otherwise (mu held).
func (p *fetchPass) start(j fetchJob) {
	k := partKey{j.topic, j.partition.Partition}
	sr := j.stashed
	j.stashed = nil
	if sr == nil {
		rctx, cancel := context.WithCancel(p.c.ctx)
		sr = &stashedRead{offset: j.partition.FetchOffset, ctx: rctx, cancel: cancel, done: make(chan struct{})}
		p.s.fetchReads.Add(1)
		// owner: the pass, then the stash; ends with the read, when the pass answers
		// before it has a slot, or with the connection (sr.ctx); Serve waits for it.
		go p.read(j, sr)
	} else {
		select {
		case <-sr.done:
			p.reading[k], p.jobs[k] = sr, j
			p.apply(k, j, sr)
			return
		default:
			// A record committed after the previous fetch answered and before this one
			// subscribed woke no one: if the read finds nothing, read again. (Not a read
			// that started in this fetch, after it subscribed.)
			if !sr.fresh {
				p.again[k] = true
			}
		}
	}
	p.reading[k], p.jobs[k] = sr, j
	go func() { // owner: runFetchJobs; ends when the read does or the pass's ctx
		select {
		case <-sr.done:
		case <-p.ctx.Done():
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.ended || p.reading[k] != sr {
			return // end applied it, or it is in the stash now
		}
		p.apply(k, j, sr)
	}()
}

// apply puts the ended read sr into j's partition of the response (mu held), unless
// its records do not fit in the room the response has left (fetch.max.bytes; the
// first partition with records is taken whole, as Kafka does): then the partition
// is answered without them, with the read's watermarks, as a read that started with
// no room is, and the client's next fetch reads them again. A read that never
// started (the connection closed) leaves the partition as it was.
func (p *fetchPass) apply(k partKey, j fetchJob, sr *stashedRead) {
	delete(p.reading, k)
	defer func() {
		select {
		case p.idle <- struct{}{}:
		default:
		}
	}()
	if !sr.started {
		return
	}
	*j.rp = sr.rp
	n := sr.n
	if n > 0 && p.total > 0 && n > p.maxBytes-p.total {
		j.rp.RecordBatches = []byte{}
		n = 0
	}
	p.total += n
	if p.again[k] {
		delete(p.again, k)
		if !p.ended && sr.n == 0 && sr.rp.ErrorCode == 0 && p.total < p.minBytes && time.Now().Before(p.deadline) {
			p.start(j)
		}
	}
}

// read reads one partition into sr once it has one of the connection's
// fetchParallelism slots, within the room the response had left then. It does not
// read when the pass answered (or the connection closed) before it had a slot.
func (p *fetchPass) read(j fetchJob, sr *stashedRead) {
	defer p.s.fetchReads.Done()
	defer close(sr.done)
	defer sr.cancel()
	select {
	case p.c.fetchSem <- struct{}{}:
	case <-p.answered:
		return
	case <-sr.ctx.Done():
		return
	}
	defer func() { <-p.c.fetchSem }()
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		return
	}
	sr.started = true
	room := p.maxBytes - p.total
	p.mu.Unlock()
	if h := p.s.fetchReadHook; h != nil {
		h(j.topic, j.partition.Partition)
	}
	rp := kmsg.NewFetchResponseTopicPartition()
	rp.Partition = j.partition.Partition
	rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = -1, -1, -1
	rp.PreferredReadReplica = -1
	rp.RecordBatches = []byte{}
	if room <= 0 {
		// Kafka's fetch.max.bytes: the partitions past it are answered empty.
		p.s.fillHead(sr.ctx, &rp, j.topic, j.partition.Partition)
		sr.rp = rp
		return
	}
	limit := min(int(j.partition.PartitionMaxBytes), room)
	codec := p.s.fetchCodec(sr.ctx, j.topic)
	if codec == codecZstd && p.req.Version < 10 {
		codec = codecNone // zstd needs Fetch v10+ (KIP-110): an older client gets the records uncompressed
	}
	sr.n = p.s.fetchPartition(sr.ctx, &rp, j.topic, j.partition.Partition, j.partition.FetchOffset, limit, codec)
	sr.rp = rp
}

// fetchStashMaxAge bounds how long a read stays in a connection's stash: an older
// one is dropped, and its partition read again.
const fetchStashMaxAge = time.Second

// stashedRead is one partition's read: its result once done is closed. started is
// set (under its pass's mu) when it has a slot and reads; a read in a stash has
// started. Cancelling ctx ends it.
type stashedRead struct {
	offset  int64
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	started bool
	at      time.Time // when it went into the stash
	rp      kmsg.FetchResponseTopicPartition
	n       int
	fresh   bool // readTopics' read for this pass: not read again when it finds nothing
}

// fetchStash holds, by partition, the reads a connection's fetch left running when
// it answered, for the connection's next fetch of that partition.
type fetchStash struct {
	mu    sync.Mutex
	reads map[partKey]*stashedRead
	hw    map[partKey]int64 // the high watermark of each partition's last answer
}

func (st *fetchStash) put(k partKey, sr *stashedRead) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.reads == nil {
		st.reads = map[partKey]*stashedRead{}
	}
	if old := st.reads[k]; old != nil && old != sr {
		old.cancel()
	}
	// No longer the read of a pass that subscribed before it: the fetch that takes it
	// reads again if it finds nothing (start), or a record committed between its
	// snapshot and that fetch's subscription waits for the safety-net poll.
	sr.fresh = false
	sr.at = time.Now()
	st.reads[k] = sr
}

// snapshot returns the reads in the stash, by partition, leaving them there, and the
// high watermarks of the connection's last answers (noteAnswer).
func (st *fetchStash) snapshot() (map[partKey]*stashedRead, map[partKey]int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return maps.Clone(st.reads), maps.Clone(st.hw)
}

// noteAnswer keeps the high watermark of each partition of resp answered without an
// error (readTopics: a fetch below it has records to read), and only those: a full
// fetch (the server has no fetch sessions) names every partition the client still
// reads from this connection, so a partition it no longer asks for (a rebalance, a
// deleted topic) is forgotten and the map stays the size of one fetch.
func (st *fetchStash) noteAnswer(resp *kmsg.FetchResponse) {
	hw := map[partKey]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == 0 && p.HighWatermark >= 0 {
				hw[partKey{t.Topic, p.Partition}] = p.HighWatermark
			}
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.hw = hw
}

// take empties the stash and returns the jobs that have a read there they may use
// (usableFor, against heads), holding it (stashed), and the other jobs, those that
// hold a read of their own already (readTopics) among them. The reads no job takes
// are cancelled: the client no longer wants them.
func (st *fetchStash) take(jobs []fetchJob, heads map[string][]streams.PartitionInfo, now time.Time) (stashed, rest []fetchJob) {
	st.mu.Lock()
	reads := st.reads
	st.reads = nil
	st.mu.Unlock()
	for _, j := range jobs {
		k := partKey{j.topic, j.partition.Partition}
		if j.stashed != nil {
			rest = append(rest, j) // read by this pass already (readTopics)
			continue
		}
		if sr := reads[k]; sr != nil && sr.usableFor(j, heads, now) {
			delete(reads, k)
			j.stashed = sr
			stashed = append(stashed, j)
			continue
		}
		rest = append(rest, j)
	}
	for _, sr := range reads {
		sr.cancel()
	}
	return stashed, rest
}

// endedEmpty reports whether sr has ended without records or with an error: a read
// usableFor refuses.
func (sr *stashedRead) endedEmpty() bool {
	select {
	case <-sr.done:
		return sr.n == 0 || sr.rp.ErrorCode != 0
	default:
		return false
	}
}

// usableFor reports whether sr may be j's read: at the offset j asks for, stashed
// less than fetchStashMaxAge ago, and within the partition's log by its head row
// (read after sr went into the stash): the offset neither below the log start
// (DeleteRecords, retention) nor past the log end, and a read that ended saw no log
// end past the current one (the stream deleted and created again under its name).
// A read that ended without records or with an error is not used: the next pass
// reads again, as a wake-up for a record committed after it may have gone to the
// fetch that left it. An ended read's watermarks are brought up to the head row's.
func (sr *stashedRead) usableFor(j fetchJob, heads map[string][]streams.PartitionInfo, now time.Time) bool {
	if sr.offset != j.partition.FetchOffset || now.Sub(sr.at) > fetchStashMaxAge {
		return false
	}
	hd, ok := headOf(heads, j.topic, j.partition.Partition)
	if !ok || sr.offset < hd.LogStartOffset || sr.offset > hd.NextOffset {
		return false
	}
	select {
	case <-sr.done:
		if sr.n == 0 || sr.rp.ErrorCode != 0 || sr.rp.HighWatermark > hd.NextOffset {
			return false
		}
		sr.rp.HighWatermark, sr.rp.LastStableOffset, sr.rp.LogStartOffset = hd.NextOffset, hd.NextOffset, hd.LogStartOffset
	default:
	}
	return true
}

// headOf returns the head row of a partition in heads, if there is one.
func headOf(heads map[string][]streams.PartitionInfo, topic string, partition int32) (streams.PartitionInfo, bool) {
	h := heads[topic]
	if partition >= 0 && int(partition) < len(h) && h[partition].Partition == partition {
		return h[partition], true
	}
	return streams.PartitionInfo{}, false
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
	return fillPartition(rp, res, err, codec, maxBytes)
}

// fillPartition puts a partition's read (res, or its error err) into rp, its batches
// compressed with codec within maxBytes, and returns the bytes of the record batches.
func fillPartition(rp *kmsg.FetchResponseTopicPartition, res *streams.FetchResult, err error, codec int8, maxBytes int) int {
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
