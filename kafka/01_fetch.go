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
	// fetchParallelism bounds the partitions of one Fetch read at once.
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
	err = wakeup.Poll(pollCtx, sub, time.Now().Add(maxWait), opts, func() (bool, error) {
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
		got, failed := s.fetchOnce(ctx, req, resp, allowed, woken)
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
}

// fetchOnce reads the partitions of req into resp and returns the record bytes resp
// holds and whether a partition failed. With woken nil it reads every partition
// (replacing what a previous pass put there); otherwise only the partitions woken
// names (by topic) that a previous pass of resp read, reading each directly, the
// others' answers left as they were. Partitions of topics the principal may not
// read are TOPIC_AUTHORIZATION_FAILED.
func (s *Server) fetchOnce(ctx context.Context, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, allowed *access.Decisions, woken map[string][]int32) (int, bool) {
	if len(woken) > 0 && len(resp.Topics) == len(req.Topics) {
		return s.fetchWoken(ctx, req, resp, woken)
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
	jobs = s.skipUnchanged(ctx, jobs)
	return s.runFetchJobs(ctx, req, resp, jobs, 0)
}

// fetchWoken is fetchOnce's pass after a wake-up: it reads again the partitions of
// resp that woken names and that a previous pass read without error (those it did
// not read, internal, refused or unknown, keep their answer).
func (s *Server) fetchWoken(ctx context.Context, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, woken map[string][]int32) (int, bool) {
	var jobs []fetchJob
	held := 0
	for ti, t := range req.Topics {
		parts := woken[t.Topic]
		for pi, p := range t.Partitions {
			rp := &resp.Topics[ti].Partitions[pi]
			if t.Topic == "" || t.Topic == consumerOffsetsTopic || rp.ErrorCode != 0 || !slices.Contains(parts, p.Partition) {
				held += len(rp.RecordBatches)
				continue
			}
			rp.RecordBatches = []byte{}
			jobs = append(jobs, fetchJob{rp: rp, topic: t.Topic, partition: p})
		}
	}
	return s.runFetchJobs(ctx, req, resp, jobs, held)
}

// runFetchJobs reads jobs into their partitions of resp, at most fetchParallelism at
// once, within the request's byte bound less held (what resp already holds), and
// returns the record bytes resp holds and whether a partition of it failed.
func (s *Server) runFetchJobs(ctx context.Context, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, jobs []fetchJob, held int) (int, bool) {
	var (
		mu    sync.Mutex
		total int
		wg    sync.WaitGroup
		sem   = make(chan struct{}, fetchParallelism)
	)
	maxBytes := int(req.MaxBytes)
	if maxBytes <= 0 {
		maxBytes = 50 << 20
	}
	total = held
	for _, j := range jobs {
		mu.Lock()
		room := maxBytes - total
		mu.Unlock()
		if room <= 0 {
			// Kafka's fetch.max.bytes: the partitions past it are answered empty.
			s.fillHead(ctx, j.rp, j.topic, j.partition.Partition)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() { // owner: runFetchJobs, which waits for it below
			defer func() { <-sem; wg.Done() }()
			limit := min(int(j.partition.PartitionMaxBytes), room)
			codec := s.fetchCodec(ctx, j.topic)
			if codec == codecZstd && req.Version < 10 {
				codec = codecNone // zstd needs Fetch v10+ (KIP-110): an older client gets the records uncompressed
			}
			n := s.fetchPartition(ctx, j.rp, j.topic, j.partition.Partition, j.partition.FetchOffset, limit, codec)
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return total, true
			}
		}
	}
	return total, false
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
