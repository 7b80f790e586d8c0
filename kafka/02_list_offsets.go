package kafka

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/streams"
)

// ListOffsets v1 to v8 (v0's old-style offset lists are not served). Timestamps: -1
// latest (the high watermark), -2 earliest (the log start), -3 (v7+) the record with
// the largest timestamp (the last: log times never decrease), -4 (v8+) the earliest
// local offset (the log start: no remote tier), >= 0 the first record at or after
// that time (streamd.offset_for_time).
var listOffsetsHandler = handler{key: 2, min: 1, max: 8, fn: handleListOffsets}

func handleListOffsets(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.ListOffsetsRequest)
	resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
	s := r.s
	topics := make([]string, len(req.Topics))
	for i, t := range req.Topics {
		topics[i] = t.Topic
	}
	allowed, err := r.decide(ctx, topics)
	if err != nil {
		return nil, err
	}
	for _, t := range req.Topics {
		rt := kmsg.NewListOffsetsResponseTopic()
		if t.Topic == consumerOffsetsTopic {
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewListOffsetsResponseTopicPartition()
				rp.Partition, rp.Timestamp, rp.Offset, rp.LeaderEpoch = p.Partition, -1, -1, -1
				listInternalOffset(&rp, p.Timestamp)
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
			continue
		}
		if !allowed.Allows(t.Topic, access.Read) {
			for _, p := range t.Partitions {
				rp := kmsg.NewListOffsetsResponseTopicPartition()
				rp.Partition, rp.Timestamp, rp.Offset, rp.LeaderEpoch = p.Partition, -1, -1, -1
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			rt.Topic = t.Topic
			resp.Topics = append(resp.Topics, rt)
			continue
		}
		rt.Topic = t.Topic
		info, infoErr := s.streams.DescribeStream(ctx, t.Topic)
		for _, p := range t.Partitions {
			rp := kmsg.NewListOffsetsResponseTopicPartition()
			rp.Partition = p.Partition
			rp.Timestamp, rp.Offset, rp.LeaderEpoch = -1, -1, -1
			switch {
			case infoErr != nil:
				rp.ErrorCode = errorCode(infoErr)
			case p.Partition < 0 || int(p.Partition) >= len(info.PartitionInfo):
				rp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			default:
				s.listOffset(ctx, &rp, t.Topic, info.PartitionInfo[p.Partition], p.Timestamp)
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}

func (s *Server) listOffset(ctx context.Context, rp *kmsg.ListOffsetsResponseTopicPartition, topic string, head streams.PartitionInfo, ts int64) {
	switch {
	case ts == -1:
		rp.Offset = head.NextOffset
	case ts == -2, ts == -4: // -4: the earliest local offset (KIP-405); there is no remote tier
		rp.Offset = head.LogStartOffset
	case ts == -3:
		if head.NextOffset > head.LogStartOffset {
			s.recordAt(ctx, rp, topic, head.Partition, head.NextOffset-1)
		} else {
			rp.Offset = head.NextOffset
		}
	case ts >= 0:
		off, err := s.streams.OffsetForTime(ctx, topic, head.Partition, time.UnixMilli(ts))
		if err != nil {
			rp.ErrorCode = errorCode(err)
			return
		}
		if off >= head.NextOffset {
			return // no record that recent: offset and timestamp -1, as Kafka answers
		}
		s.recordAt(ctx, rp, topic, head.Partition, off)
	default:
		rp.ErrorCode = kerr.InvalidRequest.Code
	}
}

// recordAt answers the first stored record at or after offset, with its log time.
func (s *Server) recordAt(ctx context.Context, rp *kmsg.ListOffsetsResponseTopicPartition, topic string, partition int32, offset int64) {
	res, err := streams.FetchTx(ctx, s.pool, topic, partition, offset, &streams.FetchOpts{MaxRecords: 1, MaxBytes: 1})
	var oor *streams.OffsetOutOfRangeError
	switch {
	case errors.As(err, &oor):
		rp.Offset = oor.LogStartOffset
	case err != nil:
		rp.ErrorCode = errorCode(err)
	case len(res.Events) == 0:
		rp.Offset = res.HighWatermark
	default:
		rp.Offset, rp.Timestamp = res.Events[0].Offset, res.Events[0].Timestamp.UnixMilli()
	}
}
