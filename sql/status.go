package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNotMigrated: the database has no streamd schema (run streamd migrate).
var ErrNotMigrated = errors.New("the database has no streamd schema: run 'streamd migrate' first")

// ErrSchemaBehind: the database lacks migrations this binary has (run streamd migrate).
var ErrSchemaBehind = errors.New("the database's streamd schema is older than this binary's")

// Querier is what Check needs: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check returns nil when the database holds every migration this binary knows (or
// more, from a newer binary), ErrNotMigrated when it has no streamd schema, and
// ErrSchemaBehind, saying which migration it is at and which it needs, when it is
// older. streamd serve's /readyz and the CLI's connection check call it.
func Check(ctx context.Context, db Querier) error {
	all, err := Migrations()
	if err != nil {
		return err
	}
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass('streamd.schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if !exists {
		return ErrNotMigrated
	}
	var latest int
	if err := db.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM streamd.schema_migrations").Scan(&latest); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if want := all[len(all)-1].Version; latest < want {
		return fmt.Errorf("%w: at migration %d, this binary needs %d: run streamd migrate", ErrSchemaBehind, latest, want)
	}
	return nil
}
