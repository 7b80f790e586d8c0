package api

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/streamd/streamd/streams"
)

func (s *Server) routes() {
	s.Handle("GET /v1/streams", s.listStreams)
	s.Handle("POST /v1/streams", s.createStream)
	s.Handle("GET /v1/streams/{stream}", s.describeStream)
	s.Handle("DELETE /v1/streams/{stream}", s.deleteStream)
	s.Handle("PATCH /v1/streams/{stream}", s.alterStream)
	s.Handle("POST /v1/streams/{stream}/records", s.produce)
	s.Handle("GET /v1/streams/{stream}/partitions/{partition}/records", s.fetch)
	s.Handle("GET /v1/streams/{stream}/partitions/{partition}/offset-for-time", s.offsetForTime)
	s.mux.Handle("/v1/", s.methodNotAllowed(s.wrap(func(r *Request) (any, error) {
		return nil, fmt.Errorf("%w: no route %s %s", ErrNotFound, r.Method, r.URL.Path)
	})))
}

func (s *Server) listStreams(r *Request) (any, error) {
	if err := r.Authorize("", ActionAdmin); err != nil {
		return nil, err
	}
	all, err := s.streams.ListStreams(r.Context())
	if err != nil {
		return nil, err
	}
	if all == nil {
		all = []streams.StreamInfo{}
	}
	return map[string]any{"streams": all}, nil
}

type createStreamRequest struct {
	Name       string `json:"name"`
	Partitions *int   `json:"partitions"` // absent: 1
}

func (s *Server) createStream(r *Request) (any, error) {
	if err := r.Authorize("", ActionAdmin); err != nil {
		return nil, err
	}
	var req createStreamRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	n, err := positive("partitions", req.Partitions)
	if err != nil {
		return nil, err
	}
	if req.Partitions == nil {
		n = 1
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("%w: partitions %d is too many", ErrBadRequest, n)
	}
	// An existing stream is 409: growing one re-maps keys, so it is asked for
	// separately (PATCH), as kafka-topics separates --create from --alter.
	if err := s.streams.AddStream(r.Context(), req.Name, int32(n)); err != nil {
		return nil, err
	}
	info, err := s.streams.DescribeStream(r.Context(), req.Name)
	if err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusCreated, Value: info}, nil
}

// alterStream grows a stream or sets its payload limit: {"partitions": N,
// "max_payload_bytes": M}, either or both.
func (s *Server) alterStream(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionAdmin); err != nil {
		return nil, err
	}
	var req struct {
		MaxPayloadBytes *int64 `json:"max_payload_bytes"`
		Partitions      *int64 `json:"partitions"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if req.Partitions == nil && req.MaxPayloadBytes == nil {
		return nil, fmt.Errorf("%w: give partitions (the new partition count) or max_payload_bytes", ErrBadRequest)
	}
	if p := req.Partitions; p != nil && (*p < 1 || *p > math.MaxInt32) {
		return nil, fmt.Errorf("%w: partitions %d: want a count of 1 or more", ErrBadRequest, *p)
	}
	if m := req.MaxPayloadBytes; m != nil && (*m < 1 || *m > streams.MaxPayloadLimit) {
		return nil, fmt.Errorf("%w: max_payload_bytes %d: want 1 to %d", ErrBadRequest, *m, streams.MaxPayloadLimit)
	}
	// Both or neither: the limit set before a refused grow stayed set.
	opts := &streams.AlterStreamOpts{}
	if m := req.MaxPayloadBytes; m != nil {
		opts.MaxPayloadBytes = ptr(int32(*m))
	}
	if p := req.Partitions; p != nil {
		opts.Partitions = ptr(int32(*p))
	}
	if err := s.streams.AlterStream(r.Context(), name, opts); err != nil {
		return nil, err
	}
	return s.streams.DescribeStream(r.Context(), name)
}

func (s *Server) describeStream(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionConsume); err != nil {
		return nil, err
	}
	return s.streams.DescribeStream(r.Context(), name)
}

func (s *Server) deleteStream(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionAdmin); err != nil {
		return nil, err
	}
	if err := s.streams.DeleteStream(r.Context(), name); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

// recordIn is one record of a produce request.
type recordIn struct {
	CorrelationID string            `json:"correlation_id"`
	CausationID   string            `json:"causation_id"`
	Data          json.RawMessage   `json:"data"`
	DataBytes     []byte            `json:"data_bytes"` // base64 in JSON
	EventID       string            `json:"event_id"`
	EventType     string            `json:"event_type"`
	Headers       map[string]string `json:"headers"`
	Key           string            `json:"key"`
	Partition     *int32            `json:"partition"`
	Version       int32             `json:"version"`
}

type produceRequest struct {
	Records []recordIn `json:"records"`
}

// produce appends the request's records atomically: all or none.
func (s *Server) produce(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionProduce); err != nil {
		return nil, err
	}
	var req produceRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if len(req.Records) == 0 {
		return nil, fmt.Errorf("%w: no records", ErrBadRequest)
	}
	recs := make([]streams.Record, len(req.Records))
	for i, in := range req.Records {
		if in.Partition != nil && *in.Partition < 0 {
			return nil, fmt.Errorf("%w: records[%d]: partition %d: want a partition number, 0 or more", ErrBadRequest, i, *in.Partition)
		}
		data := in.Data
		if string(data) == "null" {
			data = nil
		}
		recs[i] = streams.Record{Stream: name, Key: in.Key, Partition: in.Partition, EventID: in.EventID,
			EventType: in.EventType, Data: data, Bytes: in.DataBytes, Headers: in.Headers,
			CorrelationID: in.CorrelationID, CausationID: in.CausationID, Version: in.Version}
	}
	pos, err := s.streams.Produce(r.Context(), recs...)
	if err != nil {
		return nil, err
	}
	return map[string]any{"positions": pos}, nil
}

func (s *Server) fetch(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionConsume); err != nil {
		return nil, err
	}
	partition, err := partitionParam(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	offset, err := intParam(r, "offset", q.Get("offset"), 0)
	if err != nil {
		return nil, err
	}
	max, err := intParam(r, "max", q.Get("max"), 500)
	if err != nil {
		return nil, err
	}
	waitMs, err := intParam(r, "wait_ms", q.Get("wait_ms"), 0)
	if err != nil {
		return nil, err
	}
	// max=0 is refused, not read as the library's default (500).
	if max > 10000 || waitMs > 30000 || max < 1 || waitMs < 0 {
		return nil, fmt.Errorf("%w: max must be in [1, 10000] and wait_ms in [0, 30000] (got max=%d, wait_ms=%d)", ErrBadRequest, max, waitMs)
	}
	res, err := s.streams.Fetch(r.Context(), name, partition, offset,
		&streams.FetchOpts{MaxRecords: int(max), MaxWait: time.Duration(waitMs) * time.Millisecond})
	if err != nil {
		return nil, err
	}
	if res.Events == nil {
		res.Events = []streams.Event{}
	}
	return res, nil
}

func (s *Server) offsetForTime(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionConsume); err != nil {
		return nil, err
	}
	partition, err := partitionParam(r)
	if err != nil {
		return nil, err
	}
	t, err := time.Parse(time.RFC3339Nano, r.URL.Query().Get("time"))
	if err != nil {
		return nil, fmt.Errorf("%w: time must be RFC 3339, e.g. 2026-11-22T10:00:00Z", ErrBadRequest)
	}
	off, err := s.streams.OffsetForTime(r.Context(), name, partition, t)
	if err != nil {
		return nil, err
	}
	return map[string]int64{"offset": off}, nil
}

// partitionParam reads the {partition} path value: a partition number is 0 or more
// (a negative one is bad input, 400, like a negative offset; one that does not exist
// is 404).
func partitionParam(r *Request) (int32, error) {
	p, err := intParam(r, "partition", r.PathValue("partition"), 0)
	if err != nil {
		return 0, err
	}
	if p < 0 || p > math.MaxInt32 {
		return 0, fmt.Errorf("%w: partition %d: want a partition number, 0 or more", ErrBadRequest, p)
	}
	return int32(p), nil
}

func ptr[T any](v T) *T { return &v }

// idParam reads the {id} path value: ids are 0 or more (a negative one is bad
// input, 400; one that does not exist is 404).
func idParam(r *Request) (int64, error) {
	id, err := intParam(r, "id", r.PathValue("id"), 0)
	if err != nil {
		return 0, err
	}
	if id < 0 {
		return 0, fmt.Errorf("%w: id %d: ids are 0 or more", ErrBadRequest, id)
	}
	return id, nil
}

// boolParam reads a boolean query parameter (absent: false): one that is not a
// boolean is bad input, not false (replace=yes merged, force=yes did not force).
func boolParam(r *Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: %s=%q: want true or false", ErrBadRequest, name, v)
	}
	return b, nil
}

func intParam(_ *Request, name, v string, def int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not an integer", ErrBadRequest, name, v)
	}
	return n, nil
}
