package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// DescribeGroups up to v5 (v6 answers GROUP_ID_NOT_FOUND instead of the Dead state):
// classic groups with their members' metadata and assignments; streamd's own and
// KIP-848 groups with protocol type "consumer" and their members' ids.
var describeGroupsHandler = handler{key: 15, min: 0, max: 5, fn: handleDescribeGroups}

func handleDescribeGroups(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DescribeGroupsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeGroupsResponse)
	for _, id := range req.Groups {
		rg := kmsg.NewDescribeGroupsResponseGroup()
		rg.Group = id
		rg.AuthorizedOperations = -2147483648 // not asked for, or not computed
		if ok, err := r.groupAllowed(ctx, id, nil, access.Read); err != nil || !ok {
			if err != nil {
				return nil, err
			}
			rg.ErrorCode = kerr.GroupAuthorizationFailed.Code
			resp.Groups = append(resp.Groups, rg)
			continue
		}
		g, err := r.s.groups.DescribeKafkaGroup(ctx, id)
		if err != nil {
			rg.ErrorCode = errorCode(err)
			resp.Groups = append(resp.Groups, rg)
			continue
		}
		rg.State, rg.ProtocolType, rg.Protocol = g.State, g.ProtocolType, g.Protocol
		for _, m := range g.Members {
			rm := kmsg.NewDescribeGroupsResponseGroupMember()
			rm.MemberID, rm.InstanceID, rm.ClientID, rm.ClientHost = m.MemberID, groupNullable(m.InstanceID), m.ClientID, m.ClientHost
			rm.ProtocolMetadata, rm.MemberAssignment = m.Metadata, m.Assignment
			rg.Members = append(rg.Members, rm)
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp, nil
}
