package streamconfig

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// LifecycleResult says what ApplyLifecycle did.
type LifecycleResult struct {
	// Archived are the streams made read-only (lifecycle_config.archiveAfter).
	Archived []string `json:"archived"`
	// Deleted are the streams deleted (lifecycle_config.deleteAfter).
	Deleted []string `json:"deleted"`
}

// ApplyLifecycle acts on lifecycle_config at now (the zero time: the database's
// now): a stream idle (no append) for its deleteAfter is deleted, with its events and
// read indexes; one idle for its archiveAfter is archived, that is made read-only
// (its lifecycle_config gets "readOnly": true). streamd serve's coordinator leader
// runs it every retention interval; it is idempotent. A stream deleted meanwhile by
// someone else is skipped.
func ApplyLifecycle(ctx context.Context, pool *pgxpool.Pool, now time.Time) (*LifecycleResult, error) {
	var at any
	if !now.IsZero() {
		at = now
	}
	rows, err := pool.Query(ctx, "SELECT stream_name, action FROM streamd.apply_lifecycle($1)", at)
	if err != nil {
		return nil, fmt.Errorf("apply lifecycle: %w", sqlerr.Wrap(err))
	}
	type due struct{ stream, action string }
	todo, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		err := r.Scan(&d.stream, &d.action)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("apply lifecycle: %w", sqlerr.Wrap(err))
	}
	res := &LifecycleResult{Archived: []string{}, Deleted: []string{}}
	client := streams.NewClient(pool, nil)
	for _, d := range todo {
		if d.action == "archive" {
			res.Archived = append(res.Archived, d.stream)
			continue
		}
		if err := client.DeleteStream(ctx, d.stream); err != nil && !errors.Is(err, streams.ErrStreamNotFound) {
			return res, fmt.Errorf("apply lifecycle: %w", err)
		}
		res.Deleted = append(res.Deleted, d.stream)
	}
	return res, nil
}
