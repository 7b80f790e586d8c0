package streamconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// Store reads and writes stream configurations. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Get returns the configuration of stream: an empty Config when the stream has none,
// streams.ErrStreamNotFound when the stream does not exist.
func (s *Store) Get(ctx context.Context, stream string) (*Config, error) {
	return GetTx(ctx, s.pool, stream)
}

// GetTx is Get in the caller's transaction.
func GetTx(ctx context.Context, db streams.DBTX, stream string) (*Config, error) {
	var (
		exists bool
		cols   [6][]byte
	)
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM streamd.streams WHERE stream_name = $1),
		       c.retention_config, c.dead_letter_config, c.lifecycle_config,
		       c.performance_config, c.access_control_config, c.tags
		  FROM (SELECT 1) one
		  LEFT JOIN streamd.stream_configurations c ON c.stream_name = $1`, stream).
		Scan(&exists, &cols[0], &cols[1], &cols[2], &cols[3], &cols[4], &cols[5])
	if err != nil {
		return nil, fmt.Errorf("get configuration of %s: %w", stream, sqlerr.Wrap(err))
	}
	if !exists {
		return nil, fmt.Errorf("get configuration of %q: %w", stream, streams.ErrStreamNotFound)
	}
	cfg := &Config{}
	targets := []struct {
		name string
		dst  any
	}{
		{"retention_config", &cfg.Retention},
		{"dead_letter_config", &cfg.DeadLetter},
		{"lifecycle_config", &cfg.Lifecycle},
		{"performance_config", &cfg.Performance},
		{"access_control_config", &cfg.AccessControl},
		{"tags", &cfg.Tags},
	}
	for i, t := range targets {
		if cols[i] == nil {
			continue
		}
		// Lenient: keys this version does not know (written from SQL) are ignored.
		// A known key of the wrong type (written from SQL) is ErrInvalidConfig naming
		// the section: fix it with Set or SQL.
		if err := json.Unmarshal(cols[i], t.dst); err != nil {
			return nil, fmt.Errorf("get configuration of %s: %w", stream, fieldErr(t.name, "stored value does not fit: %v", err))
		}
	}
	return cfg, nil
}

// Set replaces the whole configuration of stream with cfg (a nil section becomes
// NULL). It validates cfg first and writes nothing when a field is wrong
// (ErrInvalidConfig with a *FieldError); an unknown stream is
// streams.ErrStreamNotFound. Setting the retention section also sets the stream's row
// of retention_policies, in the same statement.
func (s *Store) Set(ctx context.Context, stream string, cfg *Config) error {
	return SetTx(ctx, s.pool, stream, cfg)
}

// SetTx is Set in the caller's transaction.
func SetTx(ctx context.Context, db streams.DBTX, stream string, cfg *Config) error {
	if cfg == nil {
		cfg = &Config{}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("set configuration of %s: %w", stream, err)
	}
	args := []any{stream}
	for _, section := range []any{cfg.Retention, cfg.DeadLetter, cfg.Lifecycle, cfg.Performance, cfg.AccessControl, cfg.Tags} {
		args = append(args, jsonOrNil(section))
	}
	_, err := db.Exec(ctx, `
		INSERT INTO streamd.stream_configurations AS c (stream_name, retention_config, dead_letter_config,
		       lifecycle_config, performance_config, access_control_config, tags)
		VALUES ($1, $2::jsonb, $3::jsonb, $4::jsonb, $5::jsonb, $6::jsonb, $7::jsonb)
		ON CONFLICT (stream_name) DO UPDATE
		   SET retention_config = EXCLUDED.retention_config, dead_letter_config = EXCLUDED.dead_letter_config,
		       lifecycle_config = EXCLUDED.lifecycle_config, performance_config = EXCLUDED.performance_config,
		       access_control_config = EXCLUDED.access_control_config, tags = EXCLUDED.tags`, args...)
	if err != nil {
		return fmt.Errorf("set configuration of %s: %w", stream, sqlerr.Wrap(err))
	}
	return nil
}

// Update changes the configuration of stream with fn, in one transaction that holds
// a lock of the stream's configuration, so that concurrent Updates of one stream
// apply one after the other and none is lost (a Get then Set could lose one). fn
// gets the current configuration (an empty Config when there is none) and changes it
// in place; an error from fn writes nothing and is returned as is. The result is
// validated and written as Set does. streams.ErrStreamNotFound for an unknown stream.
// Set, SQL and other doors do not take the lock: Update orders Updates only.
func (s *Store) Update(ctx context.Context, stream string, fn func(*Config) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('streamd.stream_configurations'), hashtext($1))`, stream); err != nil {
			return fmt.Errorf("update configuration of %s: %w", stream, sqlerr.Wrap(err))
		}
		cfg, err := GetTx(ctx, tx, stream)
		if err != nil {
			return err
		}
		if err := fn(cfg); err != nil {
			return err
		}
		return SetTx(ctx, tx, stream, cfg)
	})
}

// Delete removes the configuration of stream, and with it its retention policy. It
// reports whether there was one.
func (s *Store) Delete(ctx context.Context, stream string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM streamd.stream_configurations WHERE stream_name = $1`, stream)
	if err != nil {
		return false, fmt.Errorf("delete configuration of %s: %w", stream, sqlerr.Wrap(err))
	}
	return tag.RowsAffected() > 0, nil
}

// jsonOrNil returns the JSON text of v, or nil (SQL NULL) for a nil pointer or map.
func jsonOrNil(v any) any {
	switch x := v.(type) {
	case *Retention:
		if x == nil {
			return nil
		}
	case *DeadLetter:
		if x == nil {
			return nil
		}
	case *Lifecycle:
		if x == nil {
			return nil
		}
	case *Performance:
		if x == nil {
			return nil
		}
	case *AccessControl:
		if x == nil {
			return nil
		}
	case map[string]string:
		if x == nil {
			return nil
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain types above: Marshal cannot fail.
		panic(errors.Join(errors.New("streamconfig: marshal"), err))
	}
	return string(b)
}
