package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeAcls v0 to v3: the bindings the streams' access_control_config holds that
// the filter selects (acls.go). The admin principal only.
var describeACLsHandler = handler{key: 29, min: 0, max: 3, fn: handleDescribeACLs}

func handleDescribeACLs(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DescribeACLsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeACLsResponse)
	if !r.isAdmin() {
		msg := "only the admin principal may describe ACLs"
		resp.ErrorCode, resp.ErrorMessage = kerr.ClusterAuthorizationFailed.Code, &msg
		return resp, nil
	}
	f := aclFilter{resourceType: req.ResourceType, name: req.ResourceName, pattern: req.ResourcePatternType,
		principal: req.Principal, host: req.Host, op: req.Operation, permission: req.PermissionType}
	bindings, err := r.s.aclBindings(ctx, req.ResourceName)
	if err != nil {
		return nil, err
	}
	byTopic := map[string]int{}
	for _, b := range bindings {
		if !f.matches(b) {
			continue
		}
		i, ok := byTopic[b.topic]
		if !ok {
			res := kmsg.NewDescribeACLsResponseResource()
			res.ResourceType, res.ResourceName, res.ResourcePatternType = kmsg.ACLResourceTypeTopic, b.topic, kmsg.ACLResourcePatternTypeLiteral
			resp.Resources = append(resp.Resources, res)
			i = len(resp.Resources) - 1
			byTopic[b.topic] = i
		}
		acl := kmsg.NewDescribeACLsResponseResourceACL()
		acl.Principal, acl.Host, acl.Operation, acl.PermissionType = b.kafkaPrincipal(), "*", b.op, kmsg.ACLPermissionTypeAllow
		resp.Resources[i].ACLs = append(resp.Resources[i].ACLs, acl)
	}
	return resp, nil
}
