package api

import (
	"context"

	"github.com/streamd/streamd/access"
)

// Action is what a principal wants to do with a stream (access.Action).
type Action = access.Action

// The actions a stream's access control grants, with the streamconfig.AccessControl
// list that grants each: produce (writers), consume (readers), admin (admins; admins
// may also produce and consume).
const (
	ActionProduce = access.Write
	ActionConsume = access.Read
	ActionAdmin   = access.Admin
)

// authorize is access.Authorizer.Authorize, the one rule every door applies:
// AdminPrincipal may do everything; any other principal needs the stream's
// access_control_config to grant the action. Stream-less actions (listing streams,
// creating one, queues) need AdminPrincipal.
func (s *Server) authorize(ctx context.Context, principal, stream string, action Action) error {
	return s.authz.Authorize(ctx, principal, stream, action)
}
