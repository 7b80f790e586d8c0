package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/streamd/streamd/consumergroup"
)

func init() {
	extraStatus = append(extraStatus, func(err error) (int, string, bool) {
		switch {
		case errors.Is(err, consumergroup.ErrGroupNotFound), errors.Is(err, consumergroup.ErrDeadLetterNotFound):
			return http.StatusNotFound, "not_found", true
		case errors.Is(err, consumergroup.ErrGroupNotEmpty):
			return http.StatusConflict, "group_not_empty", true
		case errors.Is(err, consumergroup.ErrInvalidGroupID), errors.Is(err, consumergroup.ErrInvalidArgument):
			return http.StatusBadRequest, "bad_request", true
		case errors.Is(err, consumergroup.ErrFenced):
			return http.StatusConflict, "fenced", true
		}
		return 0, "", false
	})
}

func (s *Server) groupRoutes() {
	s.Handle("GET /v1/streams/{stream}/groups", s.listGroups)
	s.Handle("GET /v1/streams/{stream}/groups/{group}", s.describeGroup)
	s.Handle("DELETE /v1/streams/{stream}/groups/{group}", s.deleteGroup)
	s.Handle("POST /v1/streams/{stream}/groups/{group}/reset-offsets", s.resetOffsets)
	s.Handle("GET /v1/streams/{stream}/groups/{group}/offsets", s.exportOffsets)
	s.Handle("PUT /v1/streams/{stream}/groups/{group}/offsets", s.setOffsets)
	s.Handle("GET /v1/streams/{stream}/dead-letters", s.listDeadLetters)
	s.Handle("POST /v1/streams/{stream}/dead-letters/{id}/replay", s.replayDeadLetter)
	s.Handle("POST /v1/streams/{stream}/dead-letters/{id}/discard", s.discardDeadLetter)
	s.Handle("POST /v1/streams/{stream}/dead-letters/{id}/resolve", s.resolveDeadLetter)
}

func (s *Server) listGroups(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionConsume); err != nil {
		return nil, err
	}
	groups, err := s.groups.ListGroups(r.Context(), stream)
	if err != nil {
		return nil, err
	}
	if groups == nil {
		groups = []consumergroup.GroupSummary{}
	}
	return map[string]any{"groups": groups}, nil
}

func (s *Server) describeGroup(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionConsume); err != nil {
		return nil, err
	}
	return s.groups.DescribeGroup(r.Context(), stream, r.PathValue("group"))
}

func (s *Server) deleteGroup(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionAdmin); err != nil {
		return nil, err
	}
	force, err := boolParam(r, "force")
	if err != nil {
		return nil, err
	}
	if err := s.groups.DeleteGroup(r.Context(), stream, r.PathValue("group"), force); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

// resetRequest is the body of reset-offsets: mode is earliest, latest, timestamp,
// offset or shift; value is required for offset and shift, time for timestamp. Like
// kafka-consumer-groups (--dry-run unless --execute), a reset is a preview unless
// execute is true.
type resetRequest struct {
	Execute    bool       `json:"execute"`
	Force      bool       `json:"force"`
	Mode       string     `json:"mode"`
	Partitions []int32    `json:"partitions"`
	Time       *time.Time `json:"time"`
	Value      *int64     `json:"value"`
}

func (s *Server) resetOffsets(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionAdmin); err != nil {
		return nil, err
	}
	var req resetRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	opts := consumergroup.ResetOpts{DryRun: !req.Execute, Force: req.Force, Mode: consumergroup.ResetMode(req.Mode), Partitions: req.Partitions}
	switch opts.Mode {
	case consumergroup.ResetToEarliest, consumergroup.ResetToLatest:
	case consumergroup.ResetToOffset, consumergroup.ResetShiftBy:
		if req.Value == nil {
			return nil, fmt.Errorf("%w: mode %s needs value (the %s)", ErrBadRequest, req.Mode,
				map[consumergroup.ResetMode]string{consumergroup.ResetToOffset: "offset to reset to", consumergroup.ResetShiftBy: "shift, may be negative"}[opts.Mode])
		}
		opts.Value = *req.Value
	case consumergroup.ResetToTimestamp:
		if req.Time == nil {
			return nil, fmt.Errorf("%w: mode timestamp needs time (RFC 3339)", ErrBadRequest)
		}
		opts.Time = *req.Time
	default:
		return nil, fmt.Errorf("%w: mode %q: want earliest, latest, timestamp, offset or shift", ErrBadRequest, req.Mode)
	}
	if req.Value != nil && opts.Mode != consumergroup.ResetToOffset && opts.Mode != consumergroup.ResetShiftBy {
		return nil, fmt.Errorf("%w: value goes with mode offset or shift, not %s", ErrBadRequest, req.Mode)
	}
	if req.Time != nil && opts.Mode != consumergroup.ResetToTimestamp {
		return nil, fmt.Errorf("%w: time goes with mode timestamp, not %s", ErrBadRequest, req.Mode)
	}
	changes, err := s.groups.ResetOffsets(r.Context(), stream, r.PathValue("group"), opts)
	if err != nil {
		return nil, err
	}
	if changes == nil {
		changes = []consumergroup.OffsetChange{}
	}
	return map[string]any{"changes": changes, "executed": req.Execute}, nil
}

// exportOffsets is a group's committed offsets on the stream (the CLI's groups offsets
// export), in the form setOffsets takes back.
func (s *Server) exportOffsets(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionConsume); err != nil {
		return nil, err
	}
	offs, err := s.groups.ExportOffsets(r.Context(), stream, r.PathValue("group"))
	if err != nil {
		return nil, err
	}
	out := make([]partitionOffset, len(offs))
	for i, o := range offs {
		out[i] = partitionOffset{Partition: &o.Partition, Offset: &o.Offset}
	}
	return map[string]any{"offsets": out}, nil
}

// partitionOffset is one partition's committed offset in exportOffsets and setOffsets.
type partitionOffset struct {
	Partition *int32 `json:"partition"`
	Offset    *int64 `json:"offset"`
}

// setOffsetsRequest is the body of PUT .../offsets: the offsets to set (an export, as
// kafka-consumer-groups --reset-offsets --from-file reads one), a preview unless
// execute, as reset-offsets.
type setOffsetsRequest struct {
	Execute bool              `json:"execute"`
	Force   bool              `json:"force"`
	Offsets []partitionOffset `json:"offsets"`
}

func (s *Server) setOffsets(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionAdmin); err != nil {
		return nil, err
	}
	var req setOffsetsRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if len(req.Offsets) == 0 {
		return nil, fmt.Errorf("%w: offsets: give at least one {\"partition\", \"offset\"}", ErrBadRequest)
	}
	offs := make([]consumergroup.GroupOffset, len(req.Offsets))
	for i, o := range req.Offsets {
		if o.Partition == nil || o.Offset == nil {
			return nil, fmt.Errorf("%w: offsets[%d]: both partition and offset are required", ErrBadRequest, i)
		}
		offs[i] = consumergroup.GroupOffset{Stream: stream, Partition: *o.Partition, Offset: *o.Offset}
	}
	changes, err := s.groups.SetOffsets(r.Context(), r.PathValue("group"), offs,
		&consumergroup.SetOffsetsOpts{DryRun: !req.Execute, Force: req.Force})
	if err != nil {
		return nil, err
	}
	out := make([]consumergroup.OffsetChange, len(changes))
	for i, c := range changes {
		out[i] = c.OffsetChange
	}
	return map[string]any{"changes": out, "executed": req.Execute}, nil
}

func (s *Server) listDeadLetters(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionConsume); err != nil {
		return nil, err
	}
	q := r.URL.Query()
	switch st := q.Get("status"); st {
	case "", "pending", "replayed", "discarded", "resolved":
	default:
		return nil, fmt.Errorf("%w: status %q: want pending, replayed, discarded or resolved", ErrBadRequest, st)
	}
	dls, err := s.groups.DeadLetters(r.Context(), stream, q.Get("group"), q.Get("status"))
	if err != nil {
		return nil, err
	}
	if dls == nil {
		dls = []consumergroup.DeadLetter{}
	}
	return map[string]any{"dead_letters": dls}, nil
}

func (s *Server) replayDeadLetter(r *Request) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionAdmin); err != nil {
		return nil, err
	}
	id, err := idParam(r)
	if err != nil {
		return nil, err
	}
	if err := s.groups.ReplayDeadLetter(r.Context(), stream, id, r.Principal); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

func (s *Server) discardDeadLetter(r *Request) (any, error) {
	return s.settleDeadLetter(r, s.groups.DiscardDeadLetter)
}

func (s *Server) resolveDeadLetter(r *Request) (any, error) {
	return s.settleDeadLetter(r, s.groups.ResolveDeadLetter)
}

// settleDeadLetter discards or resolves a group dead letter: 204, 404 when it is not
// pending.
func (s *Server) settleDeadLetter(r *Request, settle func(context.Context, string, int64, string) error) (any, error) {
	stream := r.PathValue("stream")
	if err := r.Authorize(stream, ActionAdmin); err != nil {
		return nil, err
	}
	id, err := idParam(r)
	if err != nil {
		return nil, err
	}
	if err := settle(r.Context(), stream, id, r.Principal); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}
