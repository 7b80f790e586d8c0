package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// LeaveGroup (classic protocol): v0-v2 one member by id, v3+ a batch, static members
// by instance id.
var leaveGroupHandler = handler{key: 13, min: 0, max: 5, fn: handleLeaveGroup}

func handleLeaveGroup(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.LeaveGroupRequest)
	resp := req.ResponseKind().(*kmsg.LeaveGroupResponse)
	if ok, err := r.groupAllowed(ctx, req.Group, nil, access.Read); err != nil || !ok {
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp, err
	}
	var leavers []consumergroup.ClassicLeaver
	if req.Version < 3 {
		leavers = []consumergroup.ClassicLeaver{{MemberID: req.MemberID}}
	}
	for _, m := range req.Members {
		leavers = append(leavers, consumergroup.ClassicLeaver{MemberID: m.MemberID, InstanceID: groupString(m.InstanceID)})
	}
	errs, err := r.s.groups.Leave(ctx, req.Group, leavers)
	if err != nil {
		resp.ErrorCode = errorCode(err)
		return resp, nil
	}
	if req.Version < 3 {
		resp.ErrorCode = errorCode(errs[0])
		return resp, nil
	}
	for i, m := range req.Members {
		rm := kmsg.NewLeaveGroupResponseMember()
		rm.MemberID, rm.InstanceID, rm.ErrorCode = m.MemberID, m.InstanceID, errorCode(errs[i])
		resp.Members = append(resp.Members, rm)
	}
	return resp, nil
}
