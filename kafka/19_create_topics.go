package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/streams"
)

// CreateTopics v0 to v7: a topic is a stream, created with its configs in one
// transaction. Replication is PostgreSQL's: any replication factor is accepted and
// 1 reported; manual replica assignments are refused.
var createTopicsHandler = handler{key: 19, min: 0, max: 7, fn: handleCreateTopics}

// maxPartitions is the most partitions a stream may have (streams.CreateStreamTx
// refuses more); CreateTopics and CreatePartitions answer a larger count with
// INVALID_PARTITIONS.
const maxPartitions = 10000

// errValidateOnly rolls a validate-only request's transaction back.
var errValidateOnly = errors.New("validate only")

func handleCreateTopics(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.CreateTopicsRequest)
	resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
	s := r.s
	seen := map[string]int{}
	for _, t := range req.Topics {
		seen[t.Topic]++
	}
	for _, t := range req.Topics {
		rt := kmsg.NewCreateTopicsResponseTopic()
		rt.Topic = t.Topic
		rt.NumPartitions, rt.ReplicationFactor = -1, -1
		fail := func(code int16, msg string) {
			rt.ErrorCode, rt.ErrorMessage = code, &msg
		}
		partitions := t.NumPartitions
		if partitions == -1 {
			partitions = s.cfg.DefaultPartitions
		}
		switch {
		case !r.isAdmin():
			fail(kerr.TopicAuthorizationFailed.Code, "only the admin principal may create topics")
		case t.Topic == consumerOffsetsTopic:
			fail(kerr.TopicAlreadyExists.Code, "topic "+t.Topic+" already exists (internal: streamd keeps committed offsets as rows)")
		case seen[t.Topic] > 1:
			fail(kerr.InvalidRequest.Code, "the topic is named more than once in the request")
		case !streams.ValidName(t.Topic):
			fail(kerr.InvalidTopicException.Code, "a topic name is 1 to 249 characters of A-Z a-z 0-9 . _ -")
		case partitions < 1 || partitions > maxPartitions:
			fail(kerr.InvalidPartitions.Code, fmt.Sprintf("the partition count must be between 1 and %d", maxPartitions))
		case t.ReplicationFactor == 0 || t.ReplicationFactor < -1:
			fail(kerr.InvalidReplicationFactor.Code, "the replication factor must be -1 or positive")
		case len(t.ReplicaAssignment) > 0:
			fail(kerr.InvalidReplicaAssignment.Code, "streamd has no replicas to assign: every broker serves every partition")
		default:
			var settings *topicSettings
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if _, err := streams.DescribeStreamTx(ctx, tx, t.Topic); err == nil {
					return errTopicExists
				} else if !errors.Is(err, streams.ErrStreamNotFound) {
					return err
				}
				if err := streams.CreateStreamTx(ctx, tx, t.Topic, partitions); err != nil {
					return err
				}
				var err error
				if settings, err = loadTopicSettings(ctx, tx, t.Topic, s.cfg.Compression); err != nil {
					return err
				}
				for _, c := range t.Configs {
					if err := settings.set(c.Name, c.Value); err != nil {
						return err
					}
				}
				if err := settings.save(ctx, tx, t.Topic); err != nil {
					return err
				}
				if req.ValidateOnly {
					return errValidateOnly
				}
				return nil
			})
			switch {
			case errors.Is(err, errTopicExists):
				fail(kerr.TopicAlreadyExists.Code, "topic "+t.Topic+" already exists")
			case err != nil && !errors.Is(err, errValidateOnly):
				fail(errorCode(err), err.Error())
			default:
				rt.NumPartitions, rt.ReplicationFactor = partitions, 1
				for _, e := range settings.entries() {
					c := kmsg.NewCreateTopicsResponseTopicConfig()
					c.Name, c.Value, c.ReadOnly, c.IsSensitive = e.name, e.value, e.readOnly, false
					c.Source = int8(kmsg.ConfigSourceDynamicTopicConfig)
					if e.isDefault {
						c.Source = int8(kmsg.ConfigSourceDefaultConfig)
					}
					rt.Configs = append(rt.Configs, c)
				}
				s.forgetCompression(t.Topic)
				s.tails.drop(t.Topic)
				if !req.ValidateOnly {
					s.logger.Info("kafka topic created", "stream", t.Topic, "partitions", partitions)
				}
			}
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}

var errTopicExists = errors.New("topic exists")
