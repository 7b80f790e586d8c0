package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// ConsumerGroupDescribe (KIP-848, v0-v1): streamd groups (native Go and KIP-848
// members) with each member's owned and target partitions. A classic group or an
// unknown id is GROUP_ID_NOT_FOUND, as in Kafka.
var consumerGroupDescribeHandler = handler{key: 69, min: 0, max: 1, fn: handleConsumerGroupDescribe}

func handleConsumerGroupDescribe(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.ConsumerGroupDescribeRequest)
	resp := req.ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
	for _, id := range req.Groups {
		rg := kmsg.NewConsumerGroupDescribeResponseGroup()
		rg.Group = id
		rg.AuthorizedOperations = -2147483648
		if ok, err := r.groupAllowed(ctx, id, nil, access.Read); err != nil {
			return nil, err
		} else if !ok {
			rg.ErrorCode = kerr.GroupAuthorizationFailed.Code
			resp.Groups = append(resp.Groups, rg)
			continue
		}
		d, err := r.s.groups.DescribeConsumerGroup(ctx, id)
		if err != nil {
			rg.ErrorCode = errorCode(err)
			resp.Groups = append(resp.Groups, rg)
			continue
		}
		rg.State, rg.Epoch, rg.AssignmentEpoch, rg.AssignorName = d.State, int32(d.Epoch), int32(d.Epoch), "uniform"
		for _, m := range d.Members {
			rm := kmsg.NewConsumerGroupDescribeResponseGroupMember()
			rm.MemberID, rm.InstanceID, rm.MemberEpoch = m.MemberID, groupNullable(m.InstanceID), int32(m.MemberEpoch)
			rm.SubscribedTopics = m.Streams
			if m.Regex != "" {
				rm.SubscribedTopicRegex = &m.Regex
			}
			rm.Assignment = describedAssignment(m.Assigned)
			rm.TargetAssignment = describedAssignment(m.Target)
			rm.MemberType = -1
			rg.Members = append(rg.Members, rm)
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp, nil
}

func describedAssignment(ps []consumergroup.StreamPartition) kmsg.Assignment {
	a := kmsg.NewAssignment()
	for _, p := range ps {
		n := len(a.TopicPartitions)
		if n == 0 || a.TopicPartitions[n-1].Topic != p.Stream {
			tp := kmsg.NewAssignmentTopicPartition()
			tp.Topic, tp.TopicID = p.Stream, topicID(p.Stream)
			a.TopicPartitions = append(a.TopicPartitions, tp)
			n++
		}
		a.TopicPartitions[n-1].Partitions = append(a.TopicPartitions[n-1].Partitions, p.Partition)
	}
	return a
}
