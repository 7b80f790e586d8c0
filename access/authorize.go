package access

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/streamconfig"
)

// Action is what a principal wants to do with a stream.
type Action string

// The actions a stream's access_control_config (streamconfig.AccessControl) grants,
// with the list that grants each: Read (readers), Write (writers), Admin (admins,
// who may also read and write).
const (
	Read  Action = "read"
	Write Action = "write"
	Admin Action = "admin"
)

// ErrForbidden: the principal may not do what it asked. The error says who, what and
// on which stream.
var ErrForbidden = errors.New("forbidden")

// Authorizer decides what principals may do, from the streams' access_control_config
// as stored at the time of the call (no cache: a change applies to the next request).
// It is safe for concurrent use.
type Authorizer struct {
	configs *streamconfig.Store
}

// NewAuthorizer returns an Authorizer reading the configurations in pool.
func NewAuthorizer(pool *pgxpool.Pool) *Authorizer {
	return &Authorizer{configs: streamconfig.NewStore(pool)}
}

// Authorize returns nil when principal may do action on stream: AdminPrincipal may do
// everything; any other principal needs the stream's access_control_config to grant
// the action. A stream-less action (stream "": listing or creating streams, queues)
// needs AdminPrincipal. A refusal is ErrForbidden; a stream that does not exist
// is refused like one that grants nothing, so that a refusal tells nobody which
// streams exist. A stored access_control_config that does not fit refuses everyone
// but AdminPrincipal.
func (a *Authorizer) Authorize(ctx context.Context, principal, stream string, action Action) error {
	if principal == AdminPrincipal {
		return nil
	}
	if stream == "" {
		return fmt.Errorf("%w: principal %q may not do this: only %q may", ErrForbidden, principal, AdminPrincipal)
	}
	d, err := a.Decide(ctx, principal, []string{stream})
	if err != nil {
		return err
	}
	return d.Check(stream, action)
}

// Decide reads what principal may do with each of streams, in one query (none for
// AdminPrincipal), for a request that names several streams. The Decisions answer
// for those streams only.
func (a *Authorizer) Decide(ctx context.Context, principal string, streams []string) (*Decisions, error) {
	d := &Decisions{principal: principal}
	if principal == AdminPrincipal || len(streams) == 0 {
		return d, nil
	}
	acl, bad, err := a.configs.AccessControls(ctx, slices.Compact(slices.Sorted(slices.Values(streams))))
	if err != nil {
		return nil, err
	}
	d.acl, d.bad = acl, bad
	return d, nil
}

// Decisions is what one principal may do with the streams Authorizer.Decide read.
// Its methods only read it: safe for concurrent use.
type Decisions struct {
	principal string
	acl       map[string]*streamconfig.AccessControl
	bad       map[string]error
}

// Allows reports whether the principal may do action on stream (false for a stream
// Decide was not asked about, unless the principal is AdminPrincipal).
func (d *Decisions) Allows(stream string, action Action) bool {
	return d.Check(stream, action) == nil
}

// Check is Allows with the reason: nil, or ErrForbidden saying who may not do what.
func (d *Decisions) Check(stream string, action Action) error {
	if d.principal == AdminPrincipal {
		return nil
	}
	if err := d.bad[stream]; err != nil {
		return fmt.Errorf("%w: stream %s has an access_control_config that cannot be read: %v", ErrForbidden, stream, err)
	}
	if !d.acl[stream].Allows(d.principal, string(action)) {
		return fmt.Errorf("%w: principal %q may not %s stream %s (access_control_config)", ErrForbidden, d.principal, action, stream)
	}
	return nil
}
