package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/streams"
)

// Produce v3 (record batches v2) to v11: v12 is for transactions (KIP-890), v13
// names topics by id.
var produceHandler = handler{key: 0, min: 3, max: 11, fn: handleProduce}

// produceParallelism bounds the partitions of one Produce appended at once.
const produceParallelism = 8

func handleProduce(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	s := r.s

	acksOK := req.Acks == 0 || req.Acks == 1 || req.Acks == -1
	txn := req.TransactionID != nil
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
		defer cancel()
	}

	topics := make([]string, len(req.Topics))
	for i, t := range req.Topics {
		topics[i] = t.Topic
	}
	allowed, err := r.decide(ctx, topics)
	if err != nil {
		for k := range r.turns {
			r.turns[k].pass(ctx)
		}
		return nil, err
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, produceParallelism)
	k := 0
	for _, t := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = t.Topic
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(t.Partitions))
		for i, p := range t.Partitions {
			rp := &rt.Partitions[i]
			*rp = kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = -1, -1, -1
			turn := r.turn(k)
			k++
			switch {
			case !acksOK:
				rp.ErrorCode = kerr.InvalidRequiredAcks.Code
				turn.pass(ctx)
				continue
			case t.Topic == consumerOffsetsTopic:
				rp.ErrorCode = kerr.InvalidTopicException.Code
				setMessage(rp, consumerOffsetsTopic+" is internal: streamd keeps committed offsets as rows (OffsetCommit writes them)")
				continue
			case txn:
				rp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
				setMessage(rp, "transactions are not supported by streamd")
				turn.pass(ctx)
				continue
			case !allowed.Allows(t.Topic, access.Write):
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				turn.pass(ctx)
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() { // owner: handleProduce, which waits for it below
				defer func() { <-sem; wg.Done() }()
				defer turn.done()
				// The same partition's append of the connection's request before
				// goes first (a producer's batches append in the order sent).
				if err := turn.wait(ctx); err != nil {
					rp.ErrorCode = kerr.RequestTimedOut.Code
					return
				}
				s.producePartition(ctx, req.Version, t.Topic, p.Partition, p.Records, rp, r.isAdmin())
			}()
		}
		resp.Topics = append(resp.Topics, rt)
	}
	wg.Wait()
	if req.Acks == 0 {
		return nil, nil // Kafka sends no response to acks=0
	}
	return resp, nil
}

// producePartition appends one partition's batch, sent in a Produce of version,
// all or nothing, and fills rp. It may create a missing topic
// (Config.AutoCreateTopics) when mayCreate.
func (s *Server) producePartition(ctx context.Context, version int16, topic string, partition int32, raw []byte, rp *kmsg.ProduceResponseTopicPartition, mayCreate bool) {
	fail := func(code int16, err error) {
		rp.ErrorCode = code
		setMessage(rp, err.Error())
	}
	// Kafka's ProduceRequest.validateRecords: a batch v2 may be zstd only from v7.
	if version < 7 && len(raw) >= batchHeaderLen && raw[16] == 2 && int16(binary.BigEndian.Uint16(raw[21:]))&attrCodecMask == codecZstd {
		fail(kerr.UnsupportedCompressionType.Code, fmt.Errorf("produce v%d may not carry zstd batches (v7+)", version))
		return
	}
	batch, recs, err := decodeBatch(raw, max(64<<20, int(s.cfg.MaxRequestBytes)))
	if err != nil {
		if errors.Is(err, errCorrupt) {
			fail(kerr.CorruptMessage.Code, err)
		} else {
			fail(kerr.InvalidRecord.Code, err)
		}
		return
	}
	if s.keylessOnCompacted(ctx, topic, recs) {
		fail(kerr.InvalidRecord.Code, fmt.Errorf("%w: a compacted topic takes no record without a key", errInvalidRecord))
		return
	}
	records := toStreamRecords(recs)
	var opts *streams.AppendPartitionOpts
	if batch.ProducerID >= 0 {
		opts = &streams.AppendPartitionOpts{Producer: &streams.ProducerSequence{
			ProducerID: batch.ProducerID, Epoch: batch.ProducerEpoch, FirstSequence: batch.FirstSequence}}
	}
	pos, err := s.streams.AppendPartition(ctx, topic, partition, records, opts)
	if errors.Is(err, streams.ErrStreamNotFound) && s.cfg.AutoCreateTopics && mayCreate {
		if _, cerr := s.autoCreate(ctx, topic); cerr == nil {
			pos, err = s.streams.AppendPartition(ctx, topic, partition, records, opts)
		}
	}
	if err != nil {
		fail(produceErrorCode(err), err)
		return
	}
	rp.BaseOffset = pos.BaseOffset
	rp.LogAppendTime = pos.Timestamp.UnixMilli()
}

// keylessOnCompacted: recs hold a record without a key (null) and topic's
// cleanup.policy compacts, which Kafka's LogValidator refuses (INVALID_RECORD). The
// policy is read only for such batches, from the cache fetches use.
func (s *Server) keylessOnCompacted(ctx context.Context, topic string, recs []kmsg.Record) bool {
	for i := range recs {
		if recs[i].Key == nil {
			return s.topicCompacted(ctx, topic)
		}
	}
	return false
}

// produceErrorCode is errorCode with Produce's reading of bad records.
func produceErrorCode(err error) int16 {
	switch {
	case errors.Is(err, streams.ErrOutOfOrderSequence):
		return kerr.OutOfOrderSequenceNumber.Code
	case errors.Is(err, streams.ErrDuplicateSequence):
		return kerr.DuplicateSequenceNumber.Code
	case errors.Is(err, streams.ErrProducerFenced):
		return kerr.InvalidProducerEpoch.Code
	case errors.Is(err, streams.ErrInvalidArgument), errors.Is(err, streams.ErrInvalidJSON):
		return kerr.InvalidRecord.Code
	case errors.Is(err, context.DeadlineExceeded):
		return kerr.RequestTimedOut.Code
	}
	return errorCode(err)
}

func setMessage(rp *kmsg.ProduceResponseTopicPartition, msg string) {
	rp.ErrorMessage = &msg
}
