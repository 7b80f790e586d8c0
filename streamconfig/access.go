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
