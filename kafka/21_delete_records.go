package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// DeleteRecords v0 to v2: moves a partition's log start to the offset given (-1:
// the high watermark); the rows below it are deleted.
var deleteRecordsHandler = handler{key: 21, min: 0, max: 2, fn: handleDeleteRecords}

func handleDeleteRecords(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DeleteRecordsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteRecordsResponse)
	for _, t := range req.Topics {
		rt := kmsg.NewDeleteRecordsResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewDeleteRecordsResponseTopicPartition()
			rp.Partition = p.Partition
			rp.LowWatermark = -1
			ls, err := r.s.streams.DeleteBefore(ctx, t.Topic, p.Partition, p.Offset)
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
