// Package api is streamd's JSON admin and data API under /v1/: streams, produce and
// fetch for clients not written in Go, and (as their packages provide them) groups,
// queues and dead letters.
//
// Every /v1/ request needs a bearer token unless Config.AuthDisabled. A token maps
// to a principal; the principal "admin" may do everything, and any other principal
// only what a stream's access_control_config grants it (access.Authorizer: the rule
// the Kafka listener applies too). Request bodies are bounded by
// Config.MaxRequestBytes. Every value reaches SQL as a bind parameter.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/streams"
)

// AdminPrincipal may do everything (access.AdminPrincipal).
const AdminPrincipal = access.AdminPrincipal

// Config configures the API. A nil *Config means the defaults.
type Config struct {
	// AuthDisabled serves /v1/ without tokens, every request as AdminPrincipal. For
	// local development only. Defaults to false.
	AuthDisabled bool
	// Logger receives one line per failed request. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxRequestBytes bounds a request body; larger ones get 413. Defaults to 8 MiB.
	MaxRequestBytes int64
	// Tokens maps bearer tokens to principals. Required unless AuthDisabled.
	Tokens access.Tokens
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.MaxRequestBytes == 0 {
		out.MaxRequestBytes = 8 << 20
	}
	if out.MaxRequestBytes < 0 {
		return out, fmt.Errorf("api: Config.MaxRequestBytes %d is negative", out.MaxRequestBytes)
	}
	if !out.AuthDisabled && len(out.Tokens) == 0 {
		return out, errors.New("api: Config.Tokens is empty: give a token (STREAMD_AUTH_TOKEN or a token file) or disable auth explicitly")
	}
	if err := out.Tokens.Validate(); err != nil {
		return out, fmt.Errorf("api: %w", err)
	}
	return out, nil
}

// Validate returns the error New would return for this configuration (a short token,
// an empty principal, no token without AuthDisabled), without touching anything: a
// daemon checks its configuration before it connects or migrates.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// Server serves the API.
type Server struct {
	pool    *pgxpool.Pool
	cfg     Config
	streams *streams.Client
	groups  *consumergroup.Admin
	queues  *messages.Client
	authz   *access.Authorizer
	mux     *http.ServeMux
}

// New returns a Server on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Server, error) {
	conf, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	queues, err := messages.NewClient(pool, &messages.ClientConfig{Logger: conf.Logger})
	if err != nil {
		return nil, err
	}
	s := &Server{pool: pool, cfg: conf, streams: streams.NewClient(pool, nil), groups: consumergroup.NewAdmin(pool),
		queues: queues, authz: access.NewAuthorizer(pool), mux: http.NewServeMux()}
	s.routes()
	s.groupRoutes()
	s.queueRoutes()
	s.redriveRoutes()
	s.readByRoutes()
	s.configRoutes()
	return s, nil
}

// Handler returns the API's handler, to mount at "/v1/".
func (s *Server) Handler() http.Handler { return s.mux }

// Handle registers an extra route (e.g. from another package) behind the same
// authentication, size limit and error handling.
func (s *Server) Handle(pattern string, h HandlerFunc) {
	s.mux.Handle(pattern, s.wrap(h))
}

// HandlerFunc is an API handler: it returns the value to encode as JSON with 200 (or
// the status set by a *Status value), or an error mapped to a status by statusOf.
type HandlerFunc func(r *Request) (any, error)

// Request is an authenticated API request.
type Request struct {
	*http.Request
	Principal string
	server    *Server
}

// Authorize fails with ErrForbidden unless the principal may do action on stream.
func (r *Request) Authorize(stream string, action Action) error {
	return r.server.authorize(r.Context(), r.Principal, stream, action)
}

// Decode reads the JSON body into v, rejecting unknown fields and trailing data.
func (r *Request) Decode(v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if err := tooLarge(err); err != nil {
			return err
		}
		return fmt.Errorf("%w: malformed JSON body: %v", ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: malformed JSON body: more than one JSON value", ErrBadRequest)
	}
	return nil
}

// ReadBody reads the whole body (for a handler that parses it itself): a body over
// Config.MaxRequestBytes is ErrTooLarge (413), as in Decode.
func (r *Request) ReadBody() ([]byte, error) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		if tl := tooLarge(err); tl != nil {
			return nil, tl
		}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	return raw, nil
}

// tooLarge returns ErrTooLarge when err is the size limit's, and nil otherwise.
func tooLarge(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return fmt.Errorf("%w: request body over %d bytes", ErrTooLarge, tooBig.Limit)
	}
	return nil
}

// Status wraps a response value with a status code other than 200.
type Status struct {
	Code  int
	Value any
}

// Errors that map to HTTP statuses (see statusOf).
var (
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = access.ErrForbidden
	ErrBadRequest   = errors.New("bad request")
	ErrNotFound     = errors.New("not found")
	ErrTooLarge     = errors.New("request too large")
	ErrConflict     = errors.New("conflict")
	// ErrMethodNotAllowed: the path is a route, but not for this method (405, with
	// an Allow header).
	ErrMethodNotAllowed = errors.New("method not allowed")
)

// methodNotAllowed wraps the catch-all route: a path that another method's route
// matches is 405 with Allow, not 404 (the catch-all hid the mux's own 405).
func (s *Server) methodNotAllowed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if m == r.Method {
				continue
			}
			c := r.Clone(r.Context())
			c.Method = m
			if _, pattern := s.mux.Handler(c); pattern != "" && pattern != "/v1/" {
				allowed = append(allowed, m)
			}
		}
		if len(allowed) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.writeError(w, r, fmt.Errorf("%w: %s %s: this route takes %s", ErrMethodNotAllowed, r.Method, r.URL.Path, strings.Join(allowed, ", ")))
	})
}

// errorBody is the JSON of every error response.
type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func (s *Server) wrap(h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		principal, err := s.authenticate(hr)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="streamd"`)
			s.writeError(w, hr, err)
			return
		}
		hr.Body = http.MaxBytesReader(w, hr.Body, s.cfg.MaxRequestBytes)
		v, err := h(&Request{Request: hr, Principal: principal, server: s})
		if err != nil {
			s.writeError(w, hr, err)
			return
		}
		code := http.StatusOK
		if st, ok := v.(*Status); ok {
			code, v = st.Code, st.Value
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if v != nil {
			_ = json.NewEncoder(w).Encode(v)
		}
	})
}

func (s *Server) authenticate(r *http.Request) (string, error) {
	if s.cfg.AuthDisabled {
		return AdminPrincipal, nil
	}
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return "", fmt.Errorf("%w: send an Authorization: Bearer <token> header", ErrUnauthorized)
	}
	found, ok := s.cfg.Tokens.Principal(tok) // constant time: timing tells nothing
	if !ok {
		return "", fmt.Errorf("%w: unknown token", ErrUnauthorized)
	}
	return found, nil
}

// ErrShuttingDown is the cause with which the server that embeds the API cancels the
// requests still running when it stops (long polls): they answer 503 with
// Retry-After, not 499, which says the client went away.
var ErrShuttingDown = errors.New("the server is shutting down")

// statusOf maps an error to an HTTP status and a short machine-readable code.
func statusOf(err error) (int, string) {
	switch {
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, ErrMethodNotAllowed):
		return http.StatusMethodNotAllowed, "method_not_allowed"
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, ErrTooLarge), errors.Is(err, streams.ErrPayloadTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, ErrNotFound), errors.Is(err, streams.ErrStreamNotFound), errors.Is(err, streams.ErrPartitionNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, streams.ErrOffsetOutOfRange):
		return http.StatusRequestedRangeNotSatisfiable, "offset_out_of_range"
	case errors.Is(err, ErrConflict), errors.Is(err, streams.ErrPartitionsDecrease), errors.Is(err, streams.ErrStreamExists):
		return http.StatusConflict, "conflict"
	case errors.Is(err, ErrBadRequest), errors.Is(err, streams.ErrInvalidName), errors.Is(err, streams.ErrInvalidJSON),
		errors.Is(err, streams.ErrInvalidArgument):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, context.Canceled):
		return 499, "canceled"
	}
	for _, m := range extraStatus {
		if code, name, ok := m(err); ok {
			return code, name
		}
	}
	return http.StatusInternalServerError, "internal"
}

// extraStatus lets other files map their packages' sentinels.
var extraStatus []func(error) (int, string, bool)

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, name := statusOf(err)
	if code == 499 && errors.Is(context.Cause(r.Context()), ErrShuttingDown) {
		code, name = http.StatusServiceUnavailable, "shutting_down"
		err = fmt.Errorf("%w: try again (another instance, or this one once restarted)", ErrShuttingDown)
		w.Header().Set("Retry-After", "1")
	}
	msg := err.Error()
	if code == http.StatusInternalServerError {
		s.cfg.Logger.Error("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error; see the server log"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(errorBody{Error: msg, Code: name})
}
