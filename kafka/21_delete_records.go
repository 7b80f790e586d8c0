package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// DeleteRecords v0 to v2: moves a partition's log start to the offset given (-1:
// the high watermark); the rows below it are deleted. Needs admin on the stream.
var deleteRecordsHandler = handler{key: 21, min: 0, max: 2, fn: handleDeleteRecords}

func handleDeleteRecords(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DeleteRecordsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteRecordsResponse)
	topics := make([]string, len(req.Topics))
	for i, t := range req.Topics {
		topics[i] = t.Topic
	}
	allowed, err := r.decide(ctx, topics)
	if err != nil {
		return nil, err
	}
	for _, t := range req.Topics {
		rt := kmsg.NewDeleteRecordsResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewDeleteRecordsResponseTopicPartition()
			rp.Partition = p.Partition
			rp.LowWatermark = -1
			if !allowed.Allows(t.Topic, access.Admin) {
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				rt.Partitions = append(rt.Partitions, rp)
				continue
			}
			ls, err := r.s.streams.DeleteBefore(ctx, t.Topic, p.Partition, p.Offset)
			r.s.tails.drop(t.Topic, p.Partition) // the log start moved: a fetch below it is OFFSET_OUT_OF_RANGE
			if err != nil {
				rp.ErrorCode = errorCode(err)
			} else {
				rp.LowWatermark = ls
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}
