package api

import (
	"errors"
	"net/http"

	"github.com/streamd/streamd/messages"
)

func (s *Server) redriveRoutes() {
	s.Handle("POST /v1/queues/{queue}/redrive-tasks", s.adminOnly(s.createRedriveTask))
	s.Handle("GET /v1/redrive-tasks", s.adminOnly(s.listRedriveTasks))
	s.Handle("DELETE /v1/queues/{queue}/redrive-tasks/{id}", s.adminOnly(s.cancelRedriveTask))
}

func init() {
	extraStatus = append(extraStatus, func(err error) (int, string, bool) {
		if errors.Is(err, messages.ErrRedriveTaskNotFound) {
			return http.StatusNotFound, "not_found", true
		}
		return 0, "", false
	})
}

type redriveTaskRequest struct {
	MaxMessages int64   `json:"max_messages"`
	Rate        float64 `json:"rate"`
}

// createRedriveTask queues a background redrive of a dead-letter queue
// (messages.Client.CreateRedriveTask): the leader moves up to max_messages back to
// their origins at rate messages per second (0: unbounded).
func (s *Server) createRedriveTask(r *Request) (any, error) {
	var req redriveTaskRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	t, err := s.queues.CreateRedriveTask(r.Context(), r.PathValue("queue"),
		&messages.RedriveTaskOpts{CreatedBy: r.Principal, MaxMessages: req.MaxMessages, Rate: req.Rate})
	if err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusAccepted, Value: t}, nil
}

func (s *Server) listRedriveTasks(r *Request) (any, error) {
	tasks, err := s.queues.ListRedriveTasks(r.Context(), r.URL.Query().Get("status"))
	if err != nil {
		return nil, err
	}
	if tasks == nil {
		tasks = []messages.RedriveTask{}
	}
	return map[string]any{"tasks": tasks}, nil
}

func (s *Server) cancelRedriveTask(r *Request) (any, error) {
	id, err := idParam(r)
	if err != nil {
		return nil, err
	}
	return s.queues.CancelRedriveTask(r.Context(), r.PathValue("queue"), id)
}
