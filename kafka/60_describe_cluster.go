package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/brokers"
)

// DescribeCluster v0 to v1: the live brokers of this listener, the cluster id, and
// the lowest live node id as the controller.
var describeClusterHandler = handler{key: 60, min: 0, max: 1, fn: handleDescribeCluster}

func handleDescribeCluster(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DescribeClusterRequest)
	resp := req.ResponseKind().(*kmsg.DescribeClusterResponse)
	resp.EndpointType = req.EndpointType
	live, err := r.s.liveBrokers(ctx)
	if err != nil {
		return nil, err
	}
	id, err := brokers.ClusterID(ctx, r.s.pool)
	if err != nil {
		return nil, err
	}
	resp.ClusterID = id
	resp.ControllerID = live[0].NodeID
	resp.ClusterAuthorizedOperations = -2147483648
	for _, b := range live {
		mb := kmsg.NewDescribeClusterResponseBroker()
		mb.NodeID, mb.Host, mb.Port, mb.Rack = b.NodeID, b.Host, b.Port, b.Rack
		resp.Brokers = append(resp.Brokers, mb)
	}
	return resp, nil
}
