package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// OffsetDelete: deletes a group's committed offsets, except on topics its live
// members consume (GROUP_SUBSCRIBED_TO_TOPIC). Needs admin on every stream of the
// group and every topic named (groupAllowed), as the HTTP API's offset reset.
var offsetDeleteHandler = handler{key: 47, min: 0, max: 0, fn: handleOffsetDelete}

func handleOffsetDelete(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.OffsetDeleteRequest)
	resp := req.ResponseKind().(*kmsg.OffsetDeleteResponse)
	var parts []consumergroup.StreamPartition
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			parts = append(parts, consumergroup.StreamPartition{Stream: t.Topic, Partition: p.Partition})
		}
	}
	topics := make([]string, len(req.Topics))
	for i, t := range req.Topics {
		topics[i] = t.Topic
	}
	if ok, err := r.groupAllowed(ctx, req.Group, topics, access.Admin); err != nil || !ok {
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp, err
	}
	results, err := r.s.groups.DeleteOffsets(ctx, req.Group, parts)
	if err != nil {
		resp.ErrorCode = errorCode(err)
		return resp, nil
	}
	i := 0
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetDeleteResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetDeleteResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, errorCode(results[i].Err)
			i++
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}
