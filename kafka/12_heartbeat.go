package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// Heartbeat (classic protocol): REBALANCE_IN_PROGRESS tells the member to rejoin.
var heartbeatHandler = handler{key: 12, min: 0, max: 4, fn: handleHeartbeat}

func handleHeartbeat(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.HeartbeatRequest)
	resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
	if ok, err := r.groupAllowed(ctx, req.Group, nil, access.Read); err != nil || !ok {
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp, err
	}
	resp.ErrorCode = errorCode(r.s.groups.Heartbeat(ctx, req.Group, req.MemberID, groupString(req.InstanceID), req.Generation))
	return resp, nil
}
