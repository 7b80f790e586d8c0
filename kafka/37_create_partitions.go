package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/streams"
)

// CreatePartitions v0 to v3: grows a stream's partition count (keys move, as in
// Kafka). Fewer or as many partitions as the topic has, or more than maxPartitions,
// is INVALID_PARTITIONS. Needs admin on the stream.
var createPartitionsHandler = handler{key: 37, min: 0, max: 3, fn: handleCreatePartitions}

func handleCreatePartitions(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.CreatePartitionsRequest)
	resp := req.ResponseKind().(*kmsg.CreatePartitionsResponse)
	topics := make([]string, len(req.Topics))
	for i, t := range req.Topics {
		topics[i] = t.Topic
	}
	allowed, err := r.decide(ctx, topics)
	if err != nil {
		return nil, err
	}
	for _, t := range req.Topics {
		rt := kmsg.NewCreatePartitionsResponseTopic()
		rt.Topic = t.Topic
		if !allowed.Allows(t.Topic, access.Admin) {
			rt.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, rt)
			continue
		}
		err := pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
			info, err := streams.DescribeStreamTx(ctx, tx, t.Topic)
			if err != nil {
				return err
			}
			if t.Count <= info.Partitions {
				return fmt.Errorf("%w: topic %s has %d partitions; asked for %d", streams.ErrPartitionsDecrease, t.Topic, info.Partitions, t.Count)
			}
			if t.Count > maxPartitions {
				return fmt.Errorf("%w: topic %s: asked for %d partitions, at most %d", errTooManyPartitions, t.Topic, t.Count, maxPartitions)
			}
			if len(t.Assignment) > 0 {
				return errManualAssignment
			}
			if err := streams.CreateStreamTx(ctx, tx, t.Topic, t.Count); err != nil {
				return err
			}
			if req.ValidateOnly {
				return errValidateOnly
			}
			return nil
		})
		switch {
		case errors.Is(err, errManualAssignment):
			rt.ErrorCode = kerr.InvalidReplicaAssignment.Code
		case errors.Is(err, errTooManyPartitions):
			rt.ErrorCode = kerr.InvalidPartitions.Code
		case err != nil && !errors.Is(err, errValidateOnly):
			rt.ErrorCode = errorCode(err)
		}
		if err != nil && !errors.Is(err, errValidateOnly) {
			msg := err.Error()
			rt.ErrorMessage = &msg
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}

var errTooManyPartitions = errors.New("too many partitions")

var errManualAssignment = errors.New("streamd has no replicas to assign: every broker serves every partition")
