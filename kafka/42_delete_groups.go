package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// DeleteGroups: a group id everywhere (its classic state, its groups on every stream
// and their committed offsets); NON_EMPTY_GROUP while it has live members. Needs
// admin on every stream of the group (groupAllowed), as the HTTP API's group delete.
var deleteGroupsHandler = handler{key: 42, min: 0, max: 2, fn: handleDeleteGroups}

func handleDeleteGroups(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DeleteGroupsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteGroupsResponse)
	for _, id := range req.Groups {
		rg := kmsg.NewDeleteGroupsResponseGroup()
		rg.Group = id
		ok, err := r.groupAllowed(ctx, id, nil, access.Admin)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			rg.ErrorCode = kerr.GroupAuthorizationFailed.Code
		default:
			rg.ErrorCode = errorCode(r.s.groups.DeleteKafkaGroup(ctx, id))
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp, nil
}
