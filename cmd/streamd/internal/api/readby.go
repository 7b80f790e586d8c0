package api

import (
	"fmt"

	"github.com/streamd/streamd/streams"
)

// readByRoutes: reads by correlation id and event type, and per-stream read indexes
// (streams.Client.ReadByCorrelationID, ReadByEventType, EnableReadIndex).
func (s *Server) readByRoutes() {
	s.Handle("GET /v1/streams/{stream}/events", s.readBy)
	s.Handle("GET /v1/streams/{stream}/read-indexes", s.readIndexes)
	s.Handle("PUT /v1/streams/{stream}/read-indexes/{kind}", s.enableReadIndex)
	s.Handle("DELETE /v1/streams/{stream}/read-indexes/{kind}", s.disableReadIndex)
}

// readBy is GET /v1/streams/{stream}/events?correlation_id=X (or event_type=T)
// [&limit=N][&after_partition=P&after_offset=O].
func (s *Server) readBy(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionConsume); err != nil {
		return nil, err
	}
	q := r.URL.Query()
	corr, typ := q.Get("correlation_id"), q.Get("event_type")
	if (corr == "") == (typ == "") {
		return nil, fmt.Errorf("%w: give correlation_id or event_type, one of them", ErrBadRequest)
	}
	limit, err := intParam(r, "limit", q.Get("limit"), 500)
	if err != nil {
		return nil, err
	}
	if limit < 1 || limit > 10000 {
		return nil, fmt.Errorf("%w: limit must be in [1, 10000]", ErrBadRequest)
	}
	opts := &streams.ReadByOpts{Limit: int(limit)}
	if q.Has("after_partition") || q.Has("after_offset") {
		p, err := intParam(r, "after_partition", q.Get("after_partition"), 0)
		if err != nil {
			return nil, err
		}
		o, err := intParam(r, "after_offset", q.Get("after_offset"), 0)
		if err != nil {
			return nil, err
		}
		if p < 0 || p > 1<<31-1 {
			return nil, fmt.Errorf("%w: after_partition %d: want a partition number, 0 or more", ErrBadRequest, p)
		}
		if o < 0 {
			return nil, fmt.Errorf("%w: after_offset %d: offsets are 0 or more", ErrBadRequest, o)
		}
		opts.After = &streams.Position{Partition: int32(p), Offset: o}
	}
	var evs []streams.Event
	if corr != "" {
		evs, err = s.streams.ReadByCorrelationID(r.Context(), name, corr, opts)
	} else {
		evs, err = s.streams.ReadByEventType(r.Context(), name, typ, opts)
	}
	if err != nil {
		return nil, err
	}
	return map[string]any{"events": evs}, nil
}

func (s *Server) readIndexes(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionConsume); err != nil {
		return nil, err
	}
	idx, err := s.streams.ReadIndexes(r.Context(), name)
	if err != nil {
		return nil, err
	}
	return map[string]any{"read_indexes": idx}, nil
}

func (s *Server) enableReadIndex(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionAdmin); err != nil {
		return nil, err
	}
	if err := s.streams.EnableReadIndex(r.Context(), name, streams.ReadIndex(r.PathValue("kind"))); err != nil {
		return nil, err
	}
	return s.readIndexes(r)
}

func (s *Server) disableReadIndex(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionAdmin); err != nil {
		return nil, err
	}
	if err := s.streams.DisableReadIndex(r.Context(), name, streams.ReadIndex(r.PathValue("kind"))); err != nil {
		return nil, err
	}
	return s.readIndexes(r)
}
