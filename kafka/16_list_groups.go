package kafka

import (
	"context"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// ListGroups up to v5: every group id, classic ("classic") or streamd's own and
// KIP-848 ("consumer"), filtered by state (v4+) and type (v5+), case-insensitively
// as Kafka does, and to the groups the principal may read (groupAllowed).
var listGroupsHandler = handler{key: 16, min: 0, max: 5, fn: handleListGroups}

func handleListGroups(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.ListGroupsRequest)
	resp := req.ResponseKind().(*kmsg.ListGroupsResponse)
	groups, err := r.s.groups.ListKafkaGroups(ctx)
	if err != nil {
		resp.ErrorCode = errorCode(err)
		return resp, nil
	}
	matches := func(filter []string, v string) bool {
		return len(filter) == 0 || slices.ContainsFunc(filter, func(f string) bool { return strings.EqualFold(f, v) })
	}
	for _, g := range groups {
		if !matches(req.StatesFilter, g.State) || !matches(req.TypesFilter, g.Type) {
			continue
		}
		if ok, err := r.groupAllowed(ctx, g.Group, nil, access.Read); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		rg := kmsg.NewListGroupsResponseGroup()
		rg.Group, rg.ProtocolType, rg.GroupState, rg.GroupType = g.Group, g.ProtocolType, g.State, g.Type
		resp.Groups = append(resp.Groups, rg)
	}
	return resp, nil
}
