package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// SyncGroup (classic protocol): the leader brings the generation's assignment (computed
// by the client: range, roundrobin, cooperative-sticky, ...); the others wait for it.
var syncGroupHandler = handler{key: 14, min: 0, max: 5, fn: handleSyncGroup}

func handleSyncGroup(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.SyncGroupRequest)
	resp := req.ResponseKind().(*kmsg.SyncGroupResponse)
	if ok, err := r.groupAllowed(ctx, req.Group, nil, access.Read); err != nil || !ok {
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		resp.MemberAssignment = []byte{}
		return resp, err
	}
	sync := &consumergroup.ClassicSync{
		Group:        req.Group,
		MemberID:     req.MemberID,
		InstanceID:   groupString(req.InstanceID),
		Generation:   req.Generation,
		ProtocolType: groupString(req.ProtocolType),
		Protocol:     groupString(req.Protocol),
	}
	for _, a := range req.GroupAssignment {
		ca := consumergroup.ClassicAssignment{MemberID: a.MemberID, Assignment: a.MemberAssignment}
		if sync.ProtocolType == "" || sync.ProtocolType == "consumer" {
			ca.Partitions = assignedPartitions(a.MemberAssignment)
		}
		sync.Assignments = append(sync.Assignments, ca)
	}
	wctx, cancel := untilDraining(ctx, r)
	defer cancel()
	res, err := r.s.groups.Sync(wctx, sync)
	if err != nil {
		resp.ErrorCode = waitErrorCode(wctx, err)
		resp.MemberAssignment = []byte{}
		return resp, nil
	}
	resp.ProtocolType = groupNullable(res.ProtocolType)
	resp.Protocol = groupNullable(res.Protocol)
	resp.MemberAssignment = res.Assignment
	return resp, nil
}

// assignedPartitions decodes a "consumer" protocol assignment; nil when it does not
// decode (another protocol type), which only leaves consumer_group_status without
// the owners.
func assignedPartitions(b []byte) []consumergroup.StreamPartition {
	var a kmsg.ConsumerMemberAssignment
	if len(b) == 0 || a.ReadFrom(b) != nil {
		return nil
	}
	var out []consumergroup.StreamPartition
	for _, t := range a.Topics {
		for _, p := range t.Partitions {
			out = append(out, consumergroup.StreamPartition{Stream: t.Topic, Partition: p})
		}
	}
	return out
}
