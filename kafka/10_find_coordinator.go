package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FindCoordinator: every live instance coordinates every group (their state is in
// PostgreSQL), so the answer is the instance asked. Transactional ids get the same
// answer; the transaction APIs themselves are not served.
var findCoordinatorHandler = handler{key: 10, min: 0, max: 6, fn: handleFindCoordinator}

func handleFindCoordinator(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.FindCoordinatorRequest)
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	me := r.s.self()
	if req.Version < 4 {
		resp.NodeID, resp.Host, resp.Port = me.NodeID, me.Host, me.Port
		return resp, nil
	}
	for _, key := range req.CoordinatorKeys {
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key, c.NodeID, c.Host, c.Port = key, me.NodeID, me.Host, me.Port
		resp.Coordinators = append(resp.Coordinators, c)
	}
	return resp, nil
}
