package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/streamconfig"
)

// The ACL APIs (DescribeAcls 29, CreateAcls 30, DeleteAcls 31) over the streams'
// access_control_config, the one place streamd keeps who may do what
// (docs/kafka.md, "ACLs"). A binding streamd can hold is an ALLOW of a principal
// "User:<principal>" ("User:*": every principal) from any host ("*") on a LITERAL
// topic that exists, for READ (the stream's readers), WRITE (writers) or ALL
// (admins). Anything else (DENY, a host, a PREFIXED pattern, another operation or
// resource type, another principal type, a topic that does not exist) is refused
// with INVALID_REQUEST and a message saying why; nothing is written for it. Only
// the admin principal may call them (Kafka's DESCRIBE and ALTER on the cluster):
// CLUSTER_AUTHORIZATION_FAILED otherwise. The admin principal's own rights are not
// bindings (as Kafka's super.users are not) and are not listed.

// aclBinding is one (topic, principal, operation) that access_control_config holds.
type aclBinding struct {
	topic     string
	principal string // streamd's: "rita", "*"
	op        kmsg.ACLOperation
}

// kafkaPrincipal is principal as Kafka names it.
func (b aclBinding) kafkaPrincipal() string { return "User:" + b.principal }

// aclOperations are the operations bindings map onto, with the list each is kept in.
var aclOperations = []kmsg.ACLOperation{kmsg.ACLOperationRead, kmsg.ACLOperationWrite, kmsg.ACLOperationAll}

func aclList(ac *streamconfig.AccessControl, op kmsg.ACLOperation) *[]string {
	switch op {
	case kmsg.ACLOperationRead:
		return &ac.Readers
	case kmsg.ACLOperationWrite:
		return &ac.Writers
	case kmsg.ACLOperationAll:
		return &ac.Admins
	}
	return nil
}

// errACL: a binding streamd cannot hold (INVALID_REQUEST).
var errACL = errors.New("not an ACL streamd can hold")

// bindingOf maps a creation onto a binding, or errACL saying why it cannot.
func bindingOf(c kmsg.CreateACLsRequestCreation) (aclBinding, error) {
	bad := func(format string, args ...any) (aclBinding, error) {
		return aclBinding{}, fmt.Errorf("%w: %s (streamd keeps ALLOW of READ, WRITE or ALL on a topic for User principals from any host)",
			errACL, fmt.Sprintf(format, args...))
	}
	switch {
	case c.ResourceType != kmsg.ACLResourceTypeTopic:
		return bad("resource type %s: a group's access follows its topics', the cluster's is the admin principal's", c.ResourceType)
	case c.ResourcePatternType != kmsg.ACLResourcePatternTypeLiteral && c.ResourcePatternType != kmsg.ACLResourcePatternTypeUnknown:
		return bad("pattern %s: only LITERAL topic names", c.ResourcePatternType)
	case c.PermissionType != kmsg.ACLPermissionTypeAllow:
		return bad("permission %s: streamd has allow lists only", c.PermissionType)
	case c.Host != "*":
		return bad("host %q: streamd does not authorize by host", c.Host)
	case aclList(&streamconfig.AccessControl{}, c.Operation) == nil:
		return bad("operation %s", c.Operation)
	}
	name, ok := strings.CutPrefix(c.Principal, "User:")
	if !ok || name == "" {
		return bad("principal %q: User:<name> or User:*", c.Principal)
	}
	return aclBinding{topic: c.ResourceName, principal: name, op: c.Operation}, nil
}

// aclFilter is a Describe or Delete filter.
type aclFilter struct {
	resourceType kmsg.ACLResourceType
	name         *string
	pattern      kmsg.ACLResourcePatternType
	principal    *string
	host         *string
	op           kmsg.ACLOperation
	permission   kmsg.ACLPermissionType
}

// matches reports whether the filter selects b (bindings are LITERAL TOPIC ALLOW
// from host "*").
func (f aclFilter) matches(b aclBinding) bool {
	switch f.resourceType {
	case kmsg.ACLResourceTypeAny, kmsg.ACLResourceTypeTopic:
	default:
		return false
	}
	switch f.pattern {
	case kmsg.ACLResourcePatternTypeAny, kmsg.ACLResourcePatternTypeMatch, kmsg.ACLResourcePatternTypeLiteral,
		kmsg.ACLResourcePatternTypeUnknown: // v0: literal
	default:
		return false
	}
	return (f.name == nil || *f.name == b.topic) &&
		(f.principal == nil || *f.principal == b.kafkaPrincipal()) &&
		(f.host == nil || *f.host == "*") &&
		(f.op == kmsg.ACLOperationAny || f.op == b.op) &&
		(f.permission == kmsg.ACLPermissionTypeAny || f.permission == kmsg.ACLPermissionTypeAllow)
}

// aclBindings lists every binding of every stream (or of the stream named, when
// name is set). A stream whose access_control_config does not fit has none listed.
func (s *Server) aclBindings(ctx context.Context, name *string) ([]aclBinding, error) {
	var names []string
	if name != nil {
		names = []string{*name}
	} else {
		all, err := s.streams.ListStreams(ctx)
		if err != nil {
			return nil, err
		}
		for _, st := range all {
			names = append(names, st.Name)
		}
	}
	acls, _, err := streamconfig.NewStore(s.pool).AccessControls(ctx, names)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []aclBinding
	for _, n := range names {
		ac := acls[n]
		if ac == nil {
			continue
		}
		for _, op := range aclOperations {
			for _, p := range *aclList(ac, op) {
				out = append(out, aclBinding{topic: n, principal: p, op: op})
			}
		}
	}
	return out, nil
}

// grantACL adds b to its stream's access_control_config (nothing when it is there).
func (s *Server) grantACL(ctx context.Context, b aclBinding) error {
	return streamconfig.NewStore(s.pool).Update(ctx, b.topic, func(c *streamconfig.Config) error {
		if c.AccessControl == nil {
			c.AccessControl = &streamconfig.AccessControl{}
		}
		list := aclList(c.AccessControl, b.op)
		if !slices.Contains(*list, b.principal) {
			*list = append(*list, b.principal)
		}
		return nil
	})
}

// revokeACLs removes bindings (all of one topic) from the topic's access_control_config.
func (s *Server) revokeACLs(ctx context.Context, topic string, bindings []aclBinding) error {
	return streamconfig.NewStore(s.pool).Update(ctx, topic, func(c *streamconfig.Config) error {
		if c.AccessControl == nil {
			return nil
		}
		for _, b := range bindings {
			list := aclList(c.AccessControl, b.op)
			*list = slices.DeleteFunc(*list, func(p string) bool { return p == b.principal })
		}
		return nil
	})
}

// aclErrorCode is the code of an ACL request's error.
func aclErrorCode(err error) int16 {
	if errors.Is(err, errACL) {
		return kerr.InvalidRequest.Code
	}
	return errorCode(err)
}
