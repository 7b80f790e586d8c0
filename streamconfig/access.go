package streamconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// AccessControl returns stream's access_control_config: an empty AccessControl (which
// allows nobody) when the stream has none or does not exist, so that a refusal built
// on it tells an unknown stream from a forbidden one to nobody. A stored value that
// does not fit (written from SQL) is ErrInvalidConfig naming the section.
func (s *Store) AccessControl(ctx context.Context, stream string) (*AccessControl, error) {
	var raw []byte
	err := s.pool.QueryRow(ctx, "SELECT access_control_config FROM streamd.stream_configurations WHERE stream_name = $1", stream).Scan(&raw)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read access control of %s: %w", stream, err)
	}
	ac := &AccessControl{}
	if raw != nil {
		if err := json.Unmarshal(raw, ac); err != nil {
			return nil, fmt.Errorf("read access control of %s: %w", stream, fieldErr("access_control_config", "stored value does not fit: %v", err))
		}
	}
	return ac, nil
}

// AccessControls is AccessControl for several streams in one query: an entry for
// every stream named (empty for a stream without one, or that does not exist). A
// stream whose stored value does not fit maps to its ErrInvalidConfig in the second
// map instead, so that one bad stream does not fail the others.
func (s *Store) AccessControls(ctx context.Context, streams []string) (map[string]*AccessControl, map[string]error, error) {
	rows, err := s.pool.Query(ctx, `SELECT stream_name, access_control_config FROM streamd.stream_configurations
		WHERE stream_name = ANY($1) AND access_control_config IS NOT NULL`, streams)
	if err != nil {
		return nil, nil, fmt.Errorf("read access control of %d streams: %w", len(streams), err)
	}
	out := make(map[string]*AccessControl, len(streams))
	var bad map[string]error
	for rows.Next() {
		var (
			name string
			raw  []byte
		)
		if err := rows.Scan(&name, &raw); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("read access control of %d streams: %w", len(streams), err)
		}
		ac := &AccessControl{}
		if err := json.Unmarshal(raw, ac); err != nil {
			if bad == nil {
				bad = map[string]error{}
			}
			bad[name] = fmt.Errorf("read access control of %s: %w", name, fieldErr("access_control_config", "stored value does not fit: %v", err))
			continue
		}
		out[name] = ac
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read access control of %d streams: %w", len(streams), err)
	}
	for _, name := range streams {
		if out[name] == nil && bad[name] == nil {
			out[name] = &AccessControl{}
		}
	}
	return out, bad, nil
}
