package kafka

import (
	"context"
	"errors"
	"hash/fnv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/brokers"
	"github.com/streamd/streamd/streams"
)

// Metadata up to v12: v13 only adds a top-level error code. Topic ids are derived
// from the stream name (topic_ids.go; KIP-848 assignments name topics by id); a v12
// request may name topics by id (an id no stream has is UNKNOWN_TOPIC_ID).
var metadataHandler = handler{key: 3, min: 0, max: 12, fn: handleMetadata}

func handleMetadata(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.MetadataRequest)
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	s := r.s

	live, err := s.liveBrokers(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range live {
		mb := kmsg.NewMetadataResponseBroker()
		mb.NodeID, mb.Host, mb.Port, mb.Rack = b.NodeID, b.Host, b.Port, b.Rack
		resp.Brokers = append(resp.Brokers, mb)
	}
	resp.ControllerID = live[0].NodeID
	clusterID, err := brokers.ClusterID(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	resp.ClusterID = &clusterID

	all, err := s.streams.ListStreams(ctx)
	if err != nil {
		return nil, err
	}
	partitions := make(map[string]int32, len(all))
	for _, st := range all {
		partitions[st.Name] = st.Partitions
	}
	// v12 may name a topic by its id (KIP-516), derived from its name: resolved
	// through the cache Fetch and DeleteTopics use (topicNameOf), so a request that
	// names none hashes nothing. A name the cache still holds for a stream deleted
	// since is not taken (UNKNOWN_TOPIC_ID).
	for i := range req.Topics {
		if t := &req.Topics[i]; t.Topic == nil {
			name, err := s.topicNameOf(ctx, t.TopicID)
			if err != nil {
				return nil, err
			}
			if _, ok := partitions[name]; ok || name == consumerOffsetsTopic {
				t.Topic = &name
			}
		}
	}
	// A principal sees the topics it may read or write ("describe" in Kafka's terms).
	everyTopic := req.Topics == nil || (req.Version == 0 && len(req.Topics) == 0) // v0: empty; v1+: null
	var names []string
	if everyTopic {
		for _, st := range all {
			names = append(names, st.Name)
		}
	} else {
		for _, t := range req.Topics {
			if t.Topic != nil {
				names = append(names, *t.Topic)
			}
		}
	}
	allowed, err := r.decide(ctx, names)
	if err != nil {
		return nil, err
	}
	describable := func(name string) bool {
		return allowed.Allows(name, access.Read) || allowed.Allows(name, access.Write)
	}

	if everyTopic {
		for _, st := range all {
			if describable(st.Name) && st.Name != consumerOffsetsTopic {
				resp.Topics = append(resp.Topics, topicMetadata(live, st.Name, st.Partitions))
			}
		}
		resp.Topics = append(resp.Topics, internalTopicMetadata(live))
		return resp, nil
	}
	// Creating topics is AdminPrincipal's (as CreateTopics).
	autoCreate := s.cfg.AutoCreateTopics && (req.Version < 4 || req.AllowAutoTopicCreation) && r.isAdmin()
	for _, t := range req.Topics {
		if t.Topic == nil {
			mt := kmsg.NewMetadataResponseTopic()
			mt.TopicID = t.TopicID
			mt.ErrorCode = kerr.UnknownTopicID.Code
			resp.Topics = append(resp.Topics, mt)
			continue
		}
		name := *t.Topic
		if name == consumerOffsetsTopic {
			resp.Topics = append(resp.Topics, internalTopicMetadata(live))
			continue
		}
		if !describable(name) {
			// Also for a topic that does not exist: a refusal tells nobody which exist.
			mt := kmsg.NewMetadataResponseTopic()
			mt.Topic = &name
			mt.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, mt)
			continue
		}
		n, ok := partitions[name]
		if !ok && autoCreate {
			var err error
			n, err = s.autoCreate(ctx, name)
			if err != nil {
				mt := kmsg.NewMetadataResponseTopic()
				mt.Topic = &name
				mt.ErrorCode = errorCode(err)
				resp.Topics = append(resp.Topics, mt)
				continue
			}
			ok = true
		}
		if !ok {
			mt := kmsg.NewMetadataResponseTopic()
			mt.Topic = &name
			mt.ErrorCode = kerr.UnknownTopicOrPartition.Code
			if !streams.ValidName(name) {
				mt.ErrorCode = kerr.InvalidTopicException.Code
			}
			resp.Topics = append(resp.Topics, mt)
			continue
		}
		resp.Topics = append(resp.Topics, topicMetadata(live, name, n))
	}
	return resp, nil
}

// autoCreate creates topic name with DefaultPartitions partitions and returns its
// partition count (another instance may have created it with more meanwhile).
func (s *Server) autoCreate(ctx context.Context, name string) (int32, error) {
	if err := s.streams.CreateStream(ctx, name, s.cfg.DefaultPartitions); err != nil && !errors.Is(err, streams.ErrPartitionsDecrease) {
		return 0, err
	}
	info, err := s.streams.DescribeStream(ctx, name)
	if err != nil {
		return 0, err
	}
	s.logger.Info("kafka topic auto-created", "stream", name, "partitions", info.Partitions)
	return info.Partitions, nil
}

// topicMetadata names a leader for each partition among the live brokers: every
// broker can serve every partition, so the choice only spreads clients' connections.
// It is a function of the topic, the partition and the live set, so every instance
// answers alike.
func topicMetadata(live []brokers.Broker, name string, partitions int32) kmsg.MetadataResponseTopic {
	mt := kmsg.NewMetadataResponseTopic()
	mt.Topic = &name
	mt.TopicID = topicID(name)
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	base := h.Sum32()
	for p := int32(0); p < partitions; p++ {
		leader := live[(uint64(base)+uint64(p))%uint64(len(live))].NodeID
		mp := kmsg.NewMetadataResponseTopicPartition()
		mp.Partition = p
		mp.Leader = leader
		mp.LeaderEpoch = -1 // no epochs: clients skip OffsetForLeaderEpoch validation
		mp.Replicas = []int32{leader}
		mp.ISR = []int32{leader}
		mt.Partitions = append(mt.Partitions, mp)
	}
	return mt
}
