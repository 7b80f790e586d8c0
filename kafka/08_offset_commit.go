package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// OffsetCommit up to v9 (v10 names topics by id). Fenced by the generation as Kafka
// does (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS,
// FENCED_INSTANCE_ID); a request refused as a whole writes nothing. The offsets are
// the rows streamd's own groups commit (consumer_offsets).
var offsetCommitHandler = handler{key: 8, min: 0, max: 9, fn: handleOffsetCommit}

func handleOffsetCommit(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.OffsetCommitRequest)
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	commit := &consumergroup.ClassicCommit{
		Group:      req.Group,
		MemberID:   req.MemberID,
		InstanceID: groupString(req.InstanceID),
		Generation: req.Generation,
	}
	if req.Version == 0 {
		commit.Generation = -1
	}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			commit.Offsets = append(commit.Offsets, consumergroup.StreamOffset{
				Stream: t.Topic, Partition: p.Partition, Offset: p.Offset, Metadata: groupString(p.Metadata)})
		}
	}
	topics := make([]string, len(req.Topics))
	for i, t := range req.Topics {
		topics[i] = t.Topic
	}
	ok, err := r.groupAllowed(ctx, req.Group, topics, access.Read)
	if err != nil {
		return nil, err
	}
	var results []consumergroup.StreamPartitionResult
	if ok {
		results, err = r.s.commitOffsets(ctx, commit)
	}
	i := 0
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			switch {
			case !ok:
				rp.ErrorCode = kerr.GroupAuthorizationFailed.Code
			case err != nil:
				rp.ErrorCode = errorCode(err)
			default:
				rp.ErrorCode = errorCode(results[i].Err)
			}
			i++
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}

// commitOffsets commits through the group's coordinator.
func (s *Server) commitOffsets(ctx context.Context, c *consumergroup.ClassicCommit) ([]consumergroup.StreamPartitionResult, error) {
	return s.groups.CommitOffsets(ctx, c)
}
