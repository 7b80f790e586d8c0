package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/streamd/streamd/messages"
)

// Queues are not streams and have no access_control_config: their routes need the
// admin principal.

func init() {
	extraStatus = append(extraStatus, func(err error) (int, string, bool) {
		switch {
		case errors.Is(err, messages.ErrQueueNotFound):
			return http.StatusNotFound, "not_found", true
		case errors.Is(err, messages.ErrPayloadTooLarge):
			return http.StatusRequestEntityTooLarge, "too_large", true
		case errors.Is(err, messages.ErrInvalidName), errors.Is(err, messages.ErrInvalidJSON), errors.Is(err, messages.ErrInvalidArgument):
			return http.StatusBadRequest, "bad_request", true
		case errors.Is(err, messages.ErrQueueInUse):
			return http.StatusConflict, "queue_in_use", true
		case errors.Is(err, messages.ErrLeaseLost):
			return http.StatusConflict, "lease_lost", true
		}
		return 0, "", false
	})
}

func (s *Server) queueRoutes() {
	s.Handle("GET /v1/queues", s.adminOnly(s.listQueues))
	s.Handle("POST /v1/queues", s.adminOnly(s.createQueue))
	s.Handle("GET /v1/queues/{queue}", s.adminOnly(s.queueStats))
	s.Handle("DELETE /v1/queues/{queue}", s.adminOnly(s.deleteQueue))
	s.Handle("POST /v1/queues/{queue}/purge", s.adminOnly(s.purgeQueue))
	s.Handle("POST /v1/queues/{queue}/messages", s.adminOnly(s.sendMessages))
	s.Handle("GET /v1/queues/{queue}/messages", s.adminOnly(s.peekMessages))
	s.Handle("POST /v1/queues/{queue}/receive", s.adminOnly(s.receiveMessages))
	s.Handle("POST /v1/queues/{queue}/ack", s.adminOnly(s.ackMessages))
	s.Handle("POST /v1/queues/{queue}/nack", s.adminOnly(s.nackMessages))
	s.Handle("POST /v1/queues/{queue}/release", s.adminOnly(s.releaseMessages))
	s.Handle("POST /v1/queues/{queue}/redrive", s.adminOnly(s.redrive))
	s.Handle("POST /v1/queues/{queue}/discard", s.adminOnly(s.discardMessages))
	s.Handle("GET /v1/queues/{queue}/dead-letters", s.adminOnly(s.listQueueDeadLetters))
	s.Handle("POST /v1/queues/{queue}/dead-letters/replay", s.adminOnly(s.settleQueueDeadLetters("replayed")))
	s.Handle("POST /v1/queues/{queue}/dead-letters/discard", s.adminOnly(s.settleQueueDeadLetters("discarded")))
	s.Handle("POST /v1/queues/{queue}/dead-letters/resolve", s.adminOnly(s.settleQueueDeadLetters("resolved")))
}

func (s *Server) adminOnly(h HandlerFunc) HandlerFunc {
	return func(r *Request) (any, error) {
		if err := r.Authorize("", ActionAdmin); err != nil {
			return nil, err
		}
		return h(r)
	}
}

func (s *Server) listQueues(r *Request) (any, error) {
	qs, err := s.queues.ListQueues(r.Context())
	if err != nil {
		return nil, err
	}
	if qs == nil {
		qs = []messages.QueueInfo{}
	}
	return map[string]any{"queues": qs}, nil
}

// createQueueRequest's numbers are pointers: an absent one takes the default, a
// given one must be positive (the library would read 0 as "the default").
type createQueueRequest struct {
	DeadLetterQueue     *string `json:"dead_letter_queue"` // absent: kept ("" removes it)
	FIFO                *bool   `json:"fifo"`
	MaxDeliveryAttempts *int    `json:"max_delivery_attempts"`
	MaxPayloadBytes     *int    `json:"max_payload_bytes"`
	Name                string  `json:"name"`
	VisibilityTimeoutMs *int64  `json:"visibility_timeout_ms"`
}

// positive returns *p, 0 for nil, and an error naming field when *p < 1.
func positive[T int | int64](field string, p *T) (T, error) {
	if p == nil {
		return 0, nil
	}
	if *p < 1 {
		return 0, fmt.Errorf("%w: %s %d must be at least 1", ErrBadRequest, field, *p)
	}
	return *p, nil
}

// maxMs is the largest number of milliseconds a time.Duration holds (about 292
// years): a larger *_ms value would wrap around into a short or negative duration.
const maxMs = math.MaxInt64 / int64(time.Millisecond)

// tooLong refuses a *_ms field above maxMs.
func tooLong(field string, ms int64) error {
	if ms > maxMs {
		return fmt.Errorf("%w: %s %d is over %d (292 years)", ErrBadRequest, field, ms, maxMs)
	}
	return nil
}

func (s *Server) createQueue(r *Request) (any, error) {
	var req createQueueRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	attempts, err := positive("max_delivery_attempts", req.MaxDeliveryAttempts)
	if err != nil {
		return nil, err
	}
	payload, err := positive("max_payload_bytes", req.MaxPayloadBytes)
	if err != nil {
		return nil, err
	}
	vt, err := positive("visibility_timeout_ms", req.VisibilityTimeoutMs)
	if err == nil {
		err = tooLong("visibility_timeout_ms", vt)
	}
	if err != nil {
		return nil, err
	}
	u := &messages.QueueUpdate{DeadLetterQueue: req.DeadLetterQueue, FIFO: req.FIFO}
	if req.MaxDeliveryAttempts != nil {
		u.MaxDeliveryAttempts = &attempts
	}
	if req.MaxPayloadBytes != nil {
		u.MaxPayloadBytes = &payload
	}
	if req.VisibilityTimeoutMs != nil {
		d := time.Duration(vt) * time.Millisecond
		u.VisibilityTimeout = &d
	}
	// An existing queue changes only the settings the request gives; the others keep
	// their values (the defaults used to replace them, a dead-letter queue included).
	q, err := s.queues.SetQueue(r.Context(), req.Name, u)
	if err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusCreated, Value: q}, nil
}

func (s *Server) queueStats(r *Request) (any, error) {
	q := r.PathValue("queue")
	info, err := s.queues.GetQueue(r.Context(), q)
	if err != nil {
		return nil, err
	}
	stats, err := s.queues.Stats(r.Context(), q)
	if err != nil {
		return nil, err
	}
	return map[string]any{"queue": info, "stats": stats}, nil
}

func (s *Server) deleteQueue(r *Request) (any, error) {
	if err := s.queues.DeleteQueue(r.Context(), r.PathValue("queue")); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

func (s *Server) purgeQueue(r *Request) (any, error) {
	n, err := s.queues.Purge(r.Context(), r.PathValue("queue"))
	if err != nil {
		return nil, err
	}
	return map[string]int64{"purged": n}, nil
}

type messageIn struct {
	Data                json.RawMessage   `json:"data"`
	DeadLetterQueue     string            `json:"dead_letter_queue"`
	DelayMs             int64             `json:"delay_ms"`
	GroupKey            string            `json:"group_key"`
	Headers             map[string]string `json:"headers"`
	MaxDeliveryAttempts int               `json:"max_delivery_attempts"`
	MessageID           string            `json:"message_id"`
}

func (s *Server) sendMessages(r *Request) (any, error) {
	var req struct {
		Messages []messageIn `json:"messages"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrBadRequest)
	}
	out := make([]messages.OutgoingMessage, len(req.Messages))
	for i, m := range req.Messages {
		// Messages are counted from 1, as the library's errors count them.
		if m.DelayMs < 0 {
			return nil, fmt.Errorf("%w: message %d: delay_ms %d is negative", ErrBadRequest, i+1, m.DelayMs)
		}
		if err := tooLong(fmt.Sprintf("message %d: delay_ms", i+1), m.DelayMs); err != nil {
			return nil, err
		}
		out[i] = messages.OutgoingMessage{Data: m.Data, DeadLetterQueue: m.DeadLetterQueue,
			Delay: time.Duration(m.DelayMs) * time.Millisecond, GroupKey: m.GroupKey, Headers: m.Headers,
			MaxDeliveryAttempts: m.MaxDeliveryAttempts, MessageID: m.MessageID}
	}
	res, err := s.queues.Send(r.Context(), r.PathValue("queue"), out...)
	if err != nil {
		return nil, err
	}
	return map[string]any{"results": res}, nil
}

func (s *Server) peekMessages(r *Request) (any, error) {
	q := r.URL.Query()
	after, err := intParam(r, "after", q.Get("after"), 0)
	if err != nil {
		return nil, err
	}
	limit, err := intParam(r, "limit", q.Get("limit"), 100)
	if err != nil {
		return nil, err
	}
	if after < 0 || limit < 1 || limit > 10000 {
		return nil, fmt.Errorf("%w: after must be 0 or more and limit between 1 and 10000 (got after=%d, limit=%d)", ErrBadRequest, after, limit)
	}
	msgs, err := s.queues.Peek(r.Context(), r.PathValue("queue"), &messages.PeekOpts{AfterOffset: after, Limit: int(limit)})
	if err != nil {
		return nil, err
	}
	if msgs == nil {
		msgs = []*messages.Message{}
	}
	return map[string]any{"messages": msgs}, nil
}

type receiveRequest struct {
	Max                 *int  `json:"max"` // absent: 1
	VisibilityTimeoutMs int64 `json:"visibility_timeout_ms"`
	WaitMs              int64 `json:"wait_ms"`
}

func (s *Server) receiveMessages(r *Request) (any, error) {
	var req receiveRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	n, err := positive("max", req.Max)
	if err != nil {
		return nil, err
	}
	if n > 10000 { // named here: the library's error names ReceiveOpts.Max
		return nil, fmt.Errorf("%w: max %d: want 1 to 10000", ErrBadRequest, n)
	}
	if req.WaitMs < 0 || req.WaitMs > 30000 || req.VisibilityTimeoutMs < 0 {
		return nil, fmt.Errorf("%w: wait_ms must be in [0, 30000] and visibility_timeout_ms not negative", ErrBadRequest)
	}
	if err := tooLong("visibility_timeout_ms", req.VisibilityTimeoutMs); err != nil {
		return nil, err
	}
	msgs, err := s.queues.Receive(r.Context(), r.PathValue("queue"), &messages.ReceiveOpts{Max: n,
		VisibilityTimeout: time.Duration(req.VisibilityTimeoutMs) * time.Millisecond,
		Wait:              time.Duration(req.WaitMs) * time.Millisecond})
	if err != nil {
		return nil, err
	}
	if msgs == nil {
		msgs = []*messages.Message{}
	}
	return map[string]any{"messages": msgs}, nil
}

type settleRequest struct {
	DelayMs int64 `json:"delay_ms"`
	// Backoff (nack only) replaces delay_ms with messages.ExponentialBackoff(base_ms,
	// max_ms) of each receipt's attempt.
	Backoff  *backoffRequest    `json:"backoff"`
	Error    string             `json:"error"`
	Receipts []messages.Receipt `json:"receipts"`
}

type backoffRequest struct {
	BaseMs int64 `json:"base_ms"`
	MaxMs  int64 `json:"max_ms"`
}

// settleRequest reads an ack, nack or release body; delay_ms, backoff and error are
// nack's, refused on the others (a release with delay_ms released at once).
func (s *Server) settleRequest(r *Request, verb string) (*settleRequest, error) {
	var req settleRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if verb != "nack" && (req.DelayMs != 0 || req.Backoff != nil || req.Error != "") {
		return nil, fmt.Errorf("%w: delay_ms, backoff and error go with nack, not %s", ErrBadRequest, verb)
	}
	if len(req.Receipts) == 0 {
		return nil, fmt.Errorf("%w: no receipts", ErrBadRequest)
	}
	q := r.PathValue("queue")
	for i := range req.Receipts {
		if req.Receipts[i].Queue == "" {
			req.Receipts[i].Queue = q
		}
		if req.Receipts[i].Queue != q {
			return nil, fmt.Errorf("%w: receipt %d is of queue %q, not %q", ErrBadRequest, i, req.Receipts[i].Queue, q)
		}
	}
	if req.DelayMs < 0 {
		return nil, fmt.Errorf("%w: delay_ms %d is negative", ErrBadRequest, req.DelayMs)
	}
	if b := req.Backoff; b != nil && (b.BaseMs <= 0 || b.MaxMs < b.BaseMs) {
		return nil, fmt.Errorf("%w: backoff needs 0 < base_ms <= max_ms (got %d, %d)", ErrBadRequest, b.BaseMs, b.MaxMs)
	}
	if err := tooLong("delay_ms", req.DelayMs); err != nil {
		return nil, err
	}
	if b := req.Backoff; b != nil {
		if err := tooLong("backoff max_ms", b.MaxMs); err != nil {
			return nil, err
		}
	}
	return &req, nil
}

func (s *Server) ackMessages(r *Request) (any, error) {
	req, err := s.settleRequest(r, "ack")
	if err != nil {
		return nil, err
	}
	if err := s.queues.Ack(r.Context(), req.Receipts...); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

func (s *Server) nackMessages(r *Request) (any, error) {
	req, err := s.settleRequest(r, "nack")
	if err != nil {
		return nil, err
	}
	opts := &messages.NackOpts{Delay: time.Duration(req.DelayMs) * time.Millisecond, Error: req.Error}
	if b := req.Backoff; b != nil {
		opts.Backoff = messages.ExponentialBackoff(time.Duration(b.BaseMs)*time.Millisecond, time.Duration(b.MaxMs)*time.Millisecond)
	}
	err = s.queues.Nack(r.Context(), opts, req.Receipts...)
	if err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

// releaseMessages gives messages back without spending their delivery attempt (a
// consumer that stops before handling them).
func (s *Server) releaseMessages(r *Request) (any, error) {
	req, err := s.settleRequest(r, "release")
	if err != nil {
		return nil, err
	}
	if err := s.queues.Release(r.Context(), req.Receipts...); err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusNoContent}, nil
}

type redriveRequest struct {
	Limit int     `json:"limit"`
	Rate  float64 `json:"rate"`
}

func (s *Server) redrive(r *Request) (any, error) {
	var req redriveRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if req.Limit < 0 || req.Rate < 0 {
		return nil, fmt.Errorf("%w: limit and rate must not be negative", ErrBadRequest)
	}
	n, err := s.queues.Redrive(r.Context(), r.PathValue("queue"), &messages.RedriveOpts{Limit: req.Limit, Rate: req.Rate})
	if err != nil {
		return nil, err
	}
	return map[string]int{"moved": n}, nil
}

func (s *Server) discardMessages(r *Request) (any, error) {
	var req struct {
		Offsets []int64 `json:"offsets"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if len(req.Offsets) == 0 {
		return nil, fmt.Errorf("%w: no offsets", ErrBadRequest)
	}
	for i, o := range req.Offsets {
		if o < 0 {
			return nil, fmt.Errorf("%w: offsets[%d] is %d: offsets are 0 or more", ErrBadRequest, i, o)
		}
	}
	done, err := s.queues.Discard(r.Context(), r.PathValue("queue"), req.Offsets...)
	if err != nil {
		return nil, err
	}
	return map[string]any{"discarded": done}, nil
}

// listQueueDeadLetters lists a dead-letter queue's dead letters (?status=pending,
// replayed, discarded, resolved; none: all).
func (s *Server) listQueueDeadLetters(r *Request) (any, error) {
	dl, err := s.queues.DeadLetters(r.Context(), r.PathValue("queue"), r.URL.Query().Get("status"))
	if err != nil {
		return nil, err
	}
	if dl == nil {
		dl = []messages.DeadLetter{}
	}
	return map[string]any{"dead_letters": dl}, nil
}

// settleQueueDeadLetters replays, discards or resolves the dead letters named by
// message id ({"ids": [...]}), recording the principal; it answers the ids settled.
func (s *Server) settleQueueDeadLetters(status string) func(r *Request) (any, error) {
	return func(r *Request) (any, error) {
		var req struct {
			IDs []string `json:"ids"`
		}
		if err := r.Decode(&req); err != nil {
			return nil, err
		}
		if len(req.IDs) == 0 {
			return nil, fmt.Errorf("%w: no ids", ErrBadRequest)
		}
		settle := map[string]func(context.Context, string, string, ...string) ([]string, error){
			"replayed": s.queues.ReplayDeadLetters, "discarded": s.queues.DiscardDeadLetters, "resolved": s.queues.ResolveDeadLetters,
		}[status]
		got, err := settle(r.Context(), r.PathValue("queue"), r.Principal, req.IDs...)
		if err != nil {
			return nil, err
		}
		if got == nil {
			got = []string{}
		}
		return map[string]any{status: got}, nil
	}
}
