package kafka

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/streams"
)

// Fetch v4 to v12: v13 names topics by id, which streams do not have. Fetch
// sessions (v7+) are declined (session id 0): clients send full fetches.
var fetchHandler = handler{key: 1, min: 4, max: 12, fn: handleFetch}

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

	var names []string
	for _, t := range req.Topics {
		names = append(names, t.Topic)
	}
	allowed, err := r.decide(ctx, names)
	if err != nil {
		return nil, err
	}
	maxWait := time.Duration(req.MaxWaitMillis) * time.Millisecond
	var subs *subscriptions
	if maxWait > 0 && req.MinBytes > 0 {
		// Subscribe before the first read, so a commit between it and the wait still
		// ends the wait.
		subs = s.subscribe(names)
		defer subs.close()
	}
	deadline := time.Now().Add(maxWait)
	interval := 5 * time.Millisecond
	maxInterval := 100 * time.Millisecond
	if s.cfg.Wakeups != nil {
		maxInterval = time.Second
	}
	for {
		got := s.fetchOnce(ctx, req, resp, allowed)
		if ctx.Err() != nil {
			return nil, ctx.Err() // the client went away
		}
		left := time.Until(deadline)
		if subs == nil || got >= int(req.MinBytes) || left <= 0 || r.c.draining.Err() != nil {
			return resp, nil
		}
		wait := min(left, interval)
		s.fetchesWaiting.Add(1)
		woken := subs.wait(ctx, r.c.draining.Done(), wait)
		s.fetchesWaiting.Add(-1)
		if !woken {
			interval = min(2*interval, maxInterval)
		}
	}
}

// fetchOnce reads every partition of req into resp (replacing what a previous pass
// put there) and returns the record bytes read. Partitions of topics the principal
// may not read are TOPIC_AUTHORIZATION_FAILED.
func (s *Server) fetchOnce(ctx context.Context, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, allowed *access.Decisions) int {
	resp.Topics = resp.Topics[:0]
	type job struct {
		rp        *kmsg.FetchResponseTopicPartition
		topic     string
		partition kmsg.FetchRequestTopicPartition
	}
	var jobs []job
	for _, t := range req.Topics {
		rt := kmsg.NewFetchResponseTopic()
		rt.Topic = t.Topic
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
			if !allowed.Allows(t.Topic, access.Read) {
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				continue
			}
			jobs = append(jobs, job{rp: rp, topic: t.Topic, partition: p})
		}
	}
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
		go func() { // owner: fetchOnce, which waits for it below
			defer func() { <-sem; wg.Done() }()
			limit := min(int(j.partition.PartitionMaxBytes), room)
			n := s.fetchPartition(ctx, j.rp, j.topic, j.partition.Partition, j.partition.FetchOffset, limit)
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

// fetchPartition reads one partition from offset into rp and returns the bytes of
// the record batches.
func (s *Server) fetchPartition(ctx context.Context, rp *kmsg.FetchResponseTopicPartition, topic string, partition int32, offset int64, maxBytes int) int {
	res, err := streams.FetchTx(ctx, s.pool, topic, partition, offset, &streams.FetchOpts{
		MaxBytes: max(maxBytes, 1), MaxRecords: fetchMaxRecords})
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
	rp.RecordBatches = appendBatches(nil, res.Events)
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
