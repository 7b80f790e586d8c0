package kafka

import (
	"context"

	"github.com/streamd/streamd/access"
)

// Authorization (docs/kafka.md, "Security"). Every request runs as its connection's
// principal and is decided by access.Authorizer, the rule the HTTP API applies:
// AdminPrincipal may do everything; any other principal what each stream's
// access_control_config grants it. Topic requests need read (Fetch, ListOffsets,
// DescribeConfigs), write (Produce) or admin (DeleteTopics, CreatePartitions,
// IncrementalAlterConfigs, DeleteRecords); creating topics needs AdminPrincipal.
// A refused topic gets TOPIC_AUTHORIZATION_FAILED, a refused broker resource
// CLUSTER_AUTHORIZATION_FAILED; Metadata lists only the topics the principal may
// read or write. Group requests follow the group rule of groupAllowed.

// principal is the request's principal.
func (r *request) principal() string { return r.c.principal }

// isAdmin: the request's principal may do everything.
func (r *request) isAdmin() bool { return r.c.principal == access.AdminPrincipal }

// decide reads what the request's principal may do with topics (one query; none for
// AdminPrincipal).
func (r *request) decide(ctx context.Context, topics []string) (*access.Decisions, error) {
	return r.s.authz.Decide(ctx, r.c.principal, topics)
}

// groupAllowed is the group rule: the principal may use a group when it may do
// action (read; admin to delete the group or its offsets) on every stream of the
// group (consumergroup.Classic.GroupStreams: the streams it has groups or committed
// offsets on, and its classic members' subscriptions) and on every topic the request
// names. A refused request is GROUP_AUTHORIZATION_FAILED as a whole and writes
// nothing. So a group holds one set of readers; a new group (no streams yet) is
// anyone's who may read the topics it asks for.
func (r *request) groupAllowed(ctx context.Context, group string, topics []string, action access.Action) (bool, error) {
	if r.isAdmin() {
		return true, nil
	}
	streams, err := r.s.groups.GroupStreams(ctx, group)
	if err != nil {
		return false, err
	}
	all := append(streams, topics...)
	d, err := r.decide(ctx, all)
	if err != nil {
		return false, err
	}
	for _, s := range all {
		if !d.Allows(s, action) {
			return false, nil
		}
	}
	return true, nil
}
