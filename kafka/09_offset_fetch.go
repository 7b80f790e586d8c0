package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
)

// OffsetFetch up to v9 (v10 names topics by id): the committed offsets of any group
// (classic, KIP-848 or streamd's own: they are the same rows); -1 for a partition
// without one. v8+ asks for several groups at once.
var offsetFetchHandler = handler{key: 9, min: 0, max: 9, fn: handleOffsetFetch}

func handleOffsetFetch(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.OffsetFetchRequest)
	resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
	if req.Version < 8 {
		var topics map[string][]int32
		var names []string
		if req.Topics != nil {
			topics = map[string][]int32{}
			for _, t := range req.Topics {
				names = append(names, t.Topic)
				topics[t.Topic] = t.Partitions
			}
		}
		fetched, code, err := r.fetchOffsets(ctx, req.Group, names, topics)
		if err != nil {
			return nil, err
		}
		resp.ErrorCode = code
		for _, f := range fetched {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = f.topic
			for _, p := range f.partitions {
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata, rp.ErrorCode = p.partition, p.offset, -1, &p.metadata, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil
	}
	for _, g := range req.Groups {
		var topics map[string][]int32
		var names []string
		if g.Topics != nil {
			topics = map[string][]int32{}
			for _, t := range g.Topics {
				names = append(names, t.Topic)
				topics[t.Topic] = t.Partitions
			}
		}
		fetched, code, err := r.fetchOffsets(ctx, g.Group, names, topics)
		if err != nil {
			return nil, err
		}
		rg := kmsg.NewOffsetFetchResponseGroup()
		rg.Group, rg.ErrorCode = g.Group, code
		for _, f := range fetched {
			rt := kmsg.NewOffsetFetchResponseGroupTopic()
			rt.Topic = f.topic
			for _, p := range f.partitions {
				rp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.partition, p.offset, -1, &p.metadata
				rt.Partitions = append(rt.Partitions, rp)
			}
			rg.Topics = append(rg.Topics, rt)
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp, nil
}

type fetchedTopic struct {
	topic      string
	partitions []fetchedPartition
}

type fetchedPartition struct {
	partition int32
	offset    int64
	metadata  string
}

// fetchOffsets returns the committed offsets of the requested topics and partitions
// in request order (-1 where none), or every committed offset of the group when
// names is nil; and the group-level error code (GROUP_AUTHORIZATION_FAILED when the
// principal may not read the group, see groupAllowed). An error reading the
// authorization closes the connection.
func (r *request) fetchOffsets(ctx context.Context, group string, names []string, topics map[string][]int32) ([]fetchedTopic, int16, error) {
	ok, err := r.groupAllowed(ctx, group, names, access.Read)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, kerr.GroupAuthorizationFailed.Code, nil
	}
	fetched, code := r.s.fetchOffsets(ctx, group, names, topics)
	return fetched, code, nil
}

// fetchOffsets is request.fetchOffsets once authorized.
func (s *Server) fetchOffsets(ctx context.Context, group string, names []string, topics map[string][]int32) ([]fetchedTopic, int16) {
	offs, err := s.groups.FetchOffsets(ctx, group, names)
	if err != nil {
		return nil, errorCode(err)
	}
	if topics == nil {
		var out []fetchedTopic
		for _, o := range offs {
			if len(out) == 0 || out[len(out)-1].topic != o.Stream {
				out = append(out, fetchedTopic{topic: o.Stream})
			}
			last := &out[len(out)-1]
			last.partitions = append(last.partitions, fetchedPartition{o.Partition, o.Offset, o.Metadata})
		}
		return out, 0
	}
	type key struct {
		t string
		p int32
	}
	by := make(map[key]consumergroup.StreamOffset, len(offs))
	for _, o := range offs {
		by[key{o.Stream, o.Partition}] = o
	}
	out := make([]fetchedTopic, 0, len(names))
	for _, t := range names {
		ft := fetchedTopic{topic: t}
		for _, p := range topics[t] {
			fp := fetchedPartition{partition: p, offset: -1}
			if o, ok := by[key{t, p}]; ok {
				fp.offset, fp.metadata = o.Offset, o.Metadata
			}
			ft.partitions = append(ft.partitions, fp)
		}
		out = append(out, ft)
	}
	return out, 0
}
