package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DeleteAcls v0 to v3: each filter's matching bindings (acls.go) are removed from
// their topics' access_control_config and listed in its result. The admin principal
// only.
var deleteACLsHandler = handler{key: 31, min: 0, max: 3, fn: handleDeleteACLs}

func handleDeleteACLs(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DeleteACLsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteACLsResponse)
	for _, f := range req.Filters {
		res := kmsg.NewDeleteACLsResponseResult()
		if !r.isAdmin() {
			msg := "only the admin principal may delete ACLs"
			res.ErrorCode, res.ErrorMessage = kerr.ClusterAuthorizationFailed.Code, &msg
			resp.Results = append(resp.Results, res)
			continue
		}
		filter := aclFilter{resourceType: f.ResourceType, name: f.ResourceName, pattern: f.ResourcePatternType,
			principal: f.Principal, host: f.Host, op: f.Operation, permission: f.PermissionType}
		bindings, err := r.s.aclBindings(ctx, f.ResourceName)
		if err != nil {
			return nil, err
		}
		byTopic := map[string][]aclBinding{}
		var topics []string
		for _, b := range bindings {
			if filter.matches(b) {
				if byTopic[b.topic] == nil {
					topics = append(topics, b.topic)
				}
				byTopic[b.topic] = append(byTopic[b.topic], b)
			}
		}
		for _, topic := range topics {
			err := r.s.revokeACLs(ctx, topic, byTopic[topic])
			for _, b := range byTopic[topic] {
				m := kmsg.NewDeleteACLsResponseResultMatchingACL()
				m.ResourceType, m.ResourceName, m.ResourcePatternType = kmsg.ACLResourceTypeTopic, b.topic, kmsg.ACLResourcePatternTypeLiteral
				m.Principal, m.Host, m.Operation, m.PermissionType = b.kafkaPrincipal(), "*", b.op, kmsg.ACLPermissionTypeAllow
				if err != nil {
					msg := err.Error()
					m.ErrorCode, m.ErrorMessage = errorCode(err), &msg
				}
				res.MatchingACLs = append(res.MatchingACLs, m)
			}
		}
		resp.Results = append(resp.Results, res)
	}
	return resp, nil
}
