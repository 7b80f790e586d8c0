package kafka

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// JoinGroup (classic protocol): the barrier of a rebalance. The request waits
// (polling the group in PostgreSQL) until every member rejoined or the rebalance
// timeout passed, then the leader gets the members to assign. v4+ asks a new member
// to join again with the id it is given (MEMBER_ID_REQUIRED).
var joinGroupHandler = handler{key: 11, min: 0, max: 9, fn: handleJoinGroup}

func handleJoinGroup(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.JoinGroupRequest)
	resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
	resp.Generation = -1
	rebalance := req.RebalanceTimeoutMillis
	if req.Version == 0 {
		rebalance = req.SessionTimeoutMillis
	}
	if req.SessionTimeoutMillis <= 0 || rebalance <= 0 {
		resp.ErrorCode = kerr.InvalidSessionTimeout.Code
		return resp, nil
	}
	topics := subscribedTopics(req.ProtocolType, req.Protocols)
	if ok, err := r.groupAllowed(ctx, req.Group, topics, access.Read); err != nil || !ok {
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp, err
	}
	join := &consumergroup.ClassicJoin{
		Group:                req.Group,
		MemberID:             req.MemberID,
		InstanceID:           groupString(req.InstanceID),
		ClientID:             r.clientID,
		ClientHost:           clientHost(r),
		SessionTimeout:       time.Duration(req.SessionTimeoutMillis) * time.Millisecond,
		RebalanceTimeout:     time.Duration(rebalance) * time.Millisecond,
		ProtocolType:         req.ProtocolType,
		Topics:               topics,
		RequireKnownMemberID: req.Version >= 4,
	}
	for _, p := range req.Protocols {
		join.Protocols = append(join.Protocols, consumergroup.ClassicProtocol{Name: p.Name, Metadata: p.Metadata})
	}
	wctx, cancel := untilDraining(ctx, r)
	defer cancel()
	g, err := r.s.groups.Join(wctx, join)
	var required *consumergroup.MemberIDRequiredError
	switch {
	case errors.As(err, &required):
		resp.ErrorCode = kerr.MemberIDRequired.Code
		resp.MemberID = required.MemberID
		return resp, nil
	case errors.Is(err, consumergroup.ErrInvalidArgument):
		resp.ErrorCode = kerr.InvalidSessionTimeout.Code
		return resp, nil
	case err != nil:
		resp.ErrorCode = waitErrorCode(wctx, err)
		resp.MemberID = req.MemberID
		return resp, nil
	}
	resp.Generation = g.Generation
	resp.ProtocolType = groupNullable(g.ProtocolType)
	resp.Protocol = groupNullable(g.Protocol)
	if req.Version < 7 && resp.Protocol == nil {
		resp.Protocol = new(string)
	}
	resp.LeaderID = g.Leader
	resp.MemberID = g.MemberID
	for _, m := range g.Members {
		rm := kmsg.NewJoinGroupResponseMember()
		rm.MemberID, rm.InstanceID, rm.ProtocolMetadata = m.MemberID, groupNullable(m.InstanceID), m.Metadata
		resp.Members = append(resp.Members, rm)
	}
	return resp, nil
}
