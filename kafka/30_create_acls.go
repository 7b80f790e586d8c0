package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/streams"
)

// CreateAcls v0 to v3: each creation that maps onto access_control_config (acls.go)
// adds its principal to the topic's readers, writers or admins; one that does not is
// INVALID_REQUEST saying why, and writes nothing. Each creation is applied on its
// own, as Kafka does. The admin principal only.
var createACLsHandler = handler{key: 30, min: 0, max: 3, fn: handleCreateACLs}

func handleCreateACLs(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.CreateACLsRequest)
	resp := req.ResponseKind().(*kmsg.CreateACLsResponse)
	for _, c := range req.Creations {
		res := kmsg.NewCreateACLsResponseResult()
		fail := func(code int16, err error) {
			msg := err.Error()
			res.ErrorCode, res.ErrorMessage = code, &msg
		}
		if !r.isAdmin() {
			fail(kerr.ClusterAuthorizationFailed.Code, errors.New("only the admin principal may create ACLs"))
		} else if b, err := bindingOf(c); err != nil {
			fail(kerr.InvalidRequest.Code, err)
		} else if err := r.s.grantACL(ctx, b); err != nil {
			if errors.Is(err, streams.ErrStreamNotFound) {
				err = fmt.Errorf("%w: topic %s does not exist (streamd keeps ACLs in the stream's access_control_config)", errACL, b.topic)
			}
			fail(aclErrorCode(err), err)
		}
		resp.Results = append(resp.Results, res)
	}
	return resp, nil
}
