package api

import (
	"errors"
	"net/http"

	"github.com/streamd/streamd/streamconfig"
)

func init() {
	extraStatus = append(extraStatus, func(err error) (int, string, bool) {
		if errors.Is(err, streamconfig.ErrInvalidConfig) {
			return http.StatusBadRequest, "invalid_config", true
		}
		return 0, "", false
	})
}

// configRoutes: a stream's configuration (streamconfig), the sections of seed 003's
// stream_configurations.
func (s *Server) configRoutes() {
	s.Handle("GET /v1/streams/{stream}/config", s.getConfig)
	s.Handle("PUT /v1/streams/{stream}/config", s.putConfig)
}

func (s *Server) getConfig(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionConsume); err != nil {
		return nil, err
	}
	return streamconfig.NewStore(s.pool).Get(r.Context(), name)
}

// putConfig is PUT /v1/streams/{stream}/config[?replace=true] with a JSON object of
// sections: the sections given replace the stored ones (with replace=true, the whole
// configuration); an unknown section or key, or a bad value, is 400 naming it and
// writes nothing.
func (s *Server) putConfig(r *Request) (any, error) {
	name := r.PathValue("stream")
	if err := r.Authorize(name, ActionAdmin); err != nil {
		return nil, err
	}
	replace, err := boolParam(r, "replace")
	if err != nil {
		return nil, err
	}
	raw, err := r.ReadBody()
	if err != nil {
		return nil, err
	}
	store := streamconfig.NewStore(s.pool)
	cfg := &streamconfig.Config{}
	if !replace {
		if cfg, err = store.Get(r.Context(), name); err != nil {
			return nil, err
		}
	}
	if err := cfg.MergeJSON(raw); err != nil {
		return nil, err
	}
	if err := store.Set(r.Context(), name, cfg); err != nil {
		return nil, err
	}
	return store.Get(r.Context(), name)
}
