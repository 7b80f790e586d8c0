package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// ConsumerGroupHeartbeat (KIP-848, v0-v1) on streamd's own group machinery: the
// server-side sticky assignor and member epochs of consumergroup, shared with native
// Go members. A member subscribes to topic names and/or a regex (v1), resolved by the
// server on every heartbeat (see consumergroup/kip848.go).
var consumerGroupHeartbeatHandler = handler{key: 68, min: 0, max: 1, fn: handleConsumerGroupHeartbeat}

func handleConsumerGroupHeartbeat(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.ConsumerGroupHeartbeatRequest)
	resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
	fail := func(code int16, msg string) (kmsg.Response, error) {
		resp.ErrorCode, resp.ErrorMessage = code, &msg
		return resp, nil
	}
	if ok, err := r.groupAllowed(ctx, req.Group, req.SubscribedTopicNames, access.Read); err != nil {
		return nil, err
	} else if !ok {
		return fail(kerr.GroupAuthorizationFailed.Code, "the principal may not read every topic of the group")
	}
	memberID := req.MemberID
	if memberID == "" && req.MemberEpoch == 0 {
		memberID = newMemberID()
	}
	hb := &consumergroup.ConsumerHeartbeat{
		Group:            req.Group,
		MemberID:         memberID,
		InstanceID:       groupString(req.InstanceID),
		MemberEpoch:      req.MemberEpoch,
		RebalanceTimeout: time.Duration(req.RebalanceTimeoutMillis) * time.Millisecond,
		Topics:           req.SubscribedTopicNames,
		Regex:            req.SubscribedTopicRegex,
		// A regex may match the internal topic, as in Kafka: it is assigned (empty).
		Virtual: map[string]int32{consumerOffsetsTopic: 1},
	}
	// A regex resolves to the topics the principal may read (as Kafka resolves it to
	// those it may describe; the names it subscribed to were checked above). A stream
	// named as the internal topic is not served over Kafka.
	hb.Allowed = func(ctx context.Context, names []string) ([]string, error) {
		d, err := r.decide(ctx, names)
		if err != nil {
			return nil, err
		}
		out := names[:0:0]
		for _, n := range names {
			if n != consumerOffsetsTopic && (r.isAdmin() || d.Allows(n, access.Read)) {
				out = append(out, n)
			}
		}
		return out, nil
	}
	if req.Topics != nil {
		names, err := r.s.topicNamesByID(ctx)
		if err != nil {
			return nil, err
		}
		hb.OwnedKnown = true
		for _, t := range req.Topics {
			name, ok := names[t.TopicID]
			if !ok {
				continue
			}
			for _, p := range t.Partitions {
				hb.Owned = append(hb.Owned, consumergroup.StreamPartition{Stream: name, Partition: p})
			}
		}
	}
	res, err := r.s.groups.ConsumerHeartbeat(ctx, hb)
	switch {
	case errors.Is(err, consumergroup.ErrFenced):
		return fail(kerr.FencedMemberEpoch.Code, err.Error())
	case errors.Is(err, consumergroup.ErrInconsistentGroupProtocol):
		return fail(kerr.GroupIDNotFound.Code, err.Error())
	case errors.Is(err, consumergroup.ErrInvalidRegularExpression):
		return fail(kerr.InvalidRegularExpression.Code, err.Error())
	case err != nil:
		return fail(errorCode(err), err.Error())
	}
	resp.MemberID = &res.MemberID
	resp.MemberEpoch = res.MemberEpoch
	resp.HeartbeatIntervalMillis = int32(r.s.groups.ConsumerHeartbeatInterval().Milliseconds())
	if res.MemberEpoch > 0 {
		byTopic := map[string][]int32{}
		for _, p := range res.Assignment {
			byTopic[p.Stream] = append(byTopic[p.Stream], p.Partition)
		}
		a := kmsg.NewConsumerGroupHeartbeatResponseAssignment()
		topics := make([]string, 0, len(byTopic))
		for t := range byTopic {
			topics = append(topics, t)
		}
		sort.Strings(topics)
		for _, t := range topics {
			at := kmsg.NewConsumerGroupHeartbeatResponseAssignmentTopic()
			at.TopicID, at.Partitions = topicID(t), byTopic[t]
			a.Topics = append(a.Topics, at)
		}
		resp.Assignment = &a
	}
	return resp, nil
}

// topicNamesByID maps every stream's topic id to its name.
func (s *Server) topicNamesByID(ctx context.Context) (map[[16]byte]string, error) {
	all, err := s.streams.ListStreams(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[[16]byte]string, len(all)+1)
	for _, st := range all {
		out[topicID(st.Name)] = st.Name
	}
	out[topicID(consumerOffsetsTopic)] = consumerOffsetsTopic
	return out, nil
}

// newMemberID is a member id for a v0 join (v1+ clients choose their own).
func newMemberID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
