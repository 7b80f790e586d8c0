package kafka

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/streams"
)

// DeleteTopics v0 to v6, by name or (v6) by the topic id Metadata gives (topicID);
// an id no stream has is UNKNOWN_TOPIC_ID.
// Deleting a topic deletes the stream and its events; it needs admin on the stream.
var deleteTopicsHandler = handler{key: 20, min: 0, max: 6, fn: handleDeleteTopics}

func handleDeleteTopics(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DeleteTopicsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteTopicsResponse)
	type target struct {
		name *string
		id   [16]byte
		byID bool // named by id, the name found from it
	}
	var targets []target
	for i := range req.TopicNames {
		targets = append(targets, target{name: &req.TopicNames[i]})
	}
	for _, t := range req.Topics {
		tg := target{name: t.Topic, id: t.TopicID}
		if tg.name == nil && tg.id != ([16]byte{}) { // v6 names a topic by its id (KIP-516)
			name, err := r.s.topicNameOf(ctx, tg.id)
			if err != nil {
				return nil, err
			}
			if name != "" {
				tg.name, tg.byID = &name, true
			}
		}
		targets = append(targets, tg)
	}
	var names []string
	for _, t := range targets {
		if t.name != nil {
			names = append(names, *t.name)
		}
	}
	allowed, err := r.decide(ctx, names)
	if err != nil {
		return nil, err
	}
	for _, t := range targets {
		rt := kmsg.NewDeleteTopicsResponseTopic()
		rt.Topic, rt.TopicID = t.name, t.id
		if t.name == nil {
			rt.ErrorCode = kerr.UnknownTopicID.Code
		} else if !allowed.Allows(*t.name, access.Admin) {
			rt.ErrorCode = kerr.TopicAuthorizationFailed.Code
		} else if err := r.s.streams.DeleteStream(ctx, *t.name); err != nil {
			rt.ErrorCode = errorCode(err)
			if t.byID && errors.Is(err, streams.ErrStreamNotFound) {
				rt.ErrorCode = kerr.UnknownTopicID.Code // deleted since the id cache was read
			}
			msg := err.Error()
			rt.ErrorMessage = &msg
		} else {
			r.s.tails.drop(*t.name) // a topic of that name created later must not serve these records
			r.s.logger.Info("kafka topic deleted", "stream", *t.name)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}
