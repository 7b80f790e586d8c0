package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/streamd/streamd/streamconfig"
)

// Action is what a principal wants to do with a stream.
type Action string

// The actions a stream's access control grants, with the streamconfig.AccessControl
// list that grants each: produce (writers), consume (readers), admin (admins; admins
// may also produce and consume).
const (
	ActionProduce Action = "write"
	ActionConsume Action = "read"
	ActionAdmin   Action = "admin"
)

// authorize lets AdminPrincipal do everything; any other principal needs the stream's
// access_control_config (streamconfig.AccessControl) to grant the action. Stream-less
// actions (listing streams, creating one, queues) need AdminPrincipal.
func (s *Server) authorize(ctx context.Context, principal, stream string, action Action) error {
	if principal == AdminPrincipal {
		return nil
	}
	if stream == "" {
		return fmt.Errorf("%w: principal %q may not do this: only %q may", ErrForbidden, principal, AdminPrincipal)
	}
	ac, err := s.configs.AccessControl(ctx, stream)
	if errors.Is(err, streamconfig.ErrInvalidConfig) {
		return fmt.Errorf("%w: stream %s has an access_control_config the API cannot read: %v", ErrForbidden, stream, err)
	}
	if err != nil {
		return err
	}
	if !ac.Allows(principal, string(action)) {
		return fmt.Errorf("%w: principal %q may not %s stream %s (access_control_config)", ErrForbidden, principal, action, stream)
	}
	return nil
}
