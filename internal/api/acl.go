package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Action is what a principal wants to do with a stream.
type Action string

// The actions a stream's access control grants.
const (
	ActionProduce Action = "produce"
	ActionConsume Action = "consume"
	ActionAdmin   Action = "admin"
)

// acl is the part of stream_configurations.access_control_config the API enforces:
// the principals allowed each action ("*" allows every authenticated principal).
// An admin of a stream may also produce and consume.
type acl struct {
	Admin   []string `json:"admin"`
	Consume []string `json:"consume"`
	Produce []string `json:"produce"`
}

func (a *acl) allows(principal string, action Action) bool {
	has := func(list []string) bool { return slices.Contains(list, principal) || slices.Contains(list, "*") }
	if has(a.Admin) {
		return true
	}
	switch action {
	case ActionProduce:
		return has(a.Produce)
	case ActionConsume:
		return has(a.Consume)
	}
	return false
}

// authorize lets AdminPrincipal do everything; any other principal needs the stream's
// access_control_config to grant the action. Stream-less actions (listing streams,
// creating one) need AdminPrincipal.
func (s *Server) authorize(ctx context.Context, principal, stream string, action Action) error {
	if principal == AdminPrincipal {
		return nil
	}
	if stream == "" {
		return fmt.Errorf("%w: principal %q may not %s: only %q may", ErrForbidden, principal, action, AdminPrincipal)
	}
	var raw []byte
	err := s.pool.QueryRow(ctx, "SELECT access_control_config FROM streamd.stream_configurations WHERE stream_name = $1", stream).Scan(&raw)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read access control of %s: %w", stream, err)
	}
	var a acl
	if raw != nil {
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("%w: stream %s has an access_control_config the API cannot read: %v", ErrForbidden, stream, err)
		}
	}
	if !a.allows(principal, action) {
		return fmt.Errorf("%w: principal %q may not %s on stream %s", ErrForbidden, principal, action, stream)
	}
	return nil
}
