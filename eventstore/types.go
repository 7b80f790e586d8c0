package eventstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// EventType is a registered event type (seed 002).
type EventType struct {
	// Name is the type's name as events carry it in event_type. Required.
	Name string `json:"name"`
	// Description says what the event means. Defaults to empty.
	Description string `json:"description"`
	// ReferenceTable names the table whose row an event of this type refers to (seed
	// 002's reference_table); it must exist when registered. Defaults to none.
	ReferenceTable string `json:"reference_table,omitempty"`
	// CreatedAt is set by the registry.
	CreatedAt time.Time `json:"created_at"`
}

// RegisterEventType registers t, or updates the description and reference table of
// a registered type. Errors: streams.ErrInvalidArgument for an empty or too long name
// or a reference table that does not exist.
func (s *Store) RegisterEventType(ctx context.Context, t EventType) error {
	ref := &t.ReferenceTable
	if t.ReferenceTable == "" {
		ref = nil
	}
	if _, err := s.pool.Exec(ctx, "SELECT streamd.register_event_type($1, $2, $3)", t.Name, t.Description, ref); err != nil {
		return fmt.Errorf("register event type %q: %w", t.Name, sqlerr.Wrap(err))
	}
	return nil
}

// EventTypes returns the registered event types by name.
func (s *Store) EventTypes(ctx context.Context) ([]EventType, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, description, coalesce(reference_table, ''), created_at
		FROM streamd.event_types ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list event types: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[EventType])
	if err != nil {
		return nil, fmt.Errorf("list event types: %w", err)
	}
	return out, nil
}

// DeleteEventType removes a type from the registry; events already stored keep it.
// Returns false when it was not registered.
func (s *Store) DeleteEventType(ctx context.Context, name string) (bool, error) {
	tag, err := s.pool.Exec(ctx, "DELETE FROM streamd.event_types WHERE name = $1", name)
	if err != nil {
		return false, fmt.Errorf("delete event type %q: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}
