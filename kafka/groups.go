package kafka

import (
	"context"
	"errors"
	"net"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file holds what the group handlers (08, 09, 11-16, 42, 47, 68, 69) share.
// The coordinator is consumergroup.Classic (Server.groups): these handlers translate
// and call it, holding no group state of their own, so any instance coordinates any
// group and a client that loses one instance carries on against another.

// untilDraining is ctx, also ended when the server starts shutting down, for the
// requests that wait for other members (JoinGroup, SyncGroup): a waiting member is
// answered at once and finds another instance.
func untilDraining(ctx context.Context, r *request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.c.draining, cancel)
	return ctx, func() { stop(); cancel() }
}

// waitErrorCode is the error code for a wait that ended because the connection or the
// server is going away: NOT_COORDINATOR makes the client look the coordinator up
// again (any other instance) and repeat the request with its member id.
func waitErrorCode(ctx context.Context, err error) int16 {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return kerr.NotCoordinator.Code
	}
	return errorCode(err)
}

// clientHost is the client's address as Kafka reports it ("/" and the IP).
func clientHost(r *request) string {
	host, _, err := net.SplitHostPort(r.c.remote)
	if err != nil {
		return "/" + r.c.remote
	}
	return "/" + host
}

// subscribedTopics decodes the topics of a "consumer" protocol member's metadata (the
// union over its protocols); nil when none decodes.
func subscribedTopics(protocolType string, protocols []kmsg.JoinGroupRequestProtocol) []string {
	if protocolType != "consumer" {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range protocols {
		var m kmsg.ConsumerMemberMetadata
		if m.ReadFrom(p.Metadata) != nil {
			continue
		}
		for _, t := range m.Topics {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	return out
}

// groupString is *p, "" for nil.
func groupString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// groupNullable is &s, nil for "".
func groupNullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
