package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// SnapshotData is a state to store: exactly one of Data (JSON) and Bytes.
type SnapshotData struct {
	Bytes []byte
	Data  json.RawMessage
}

// Snapshot is a stored state of a key.
type Snapshot struct {
	SnapshotData
	// Version is the key version the state includes: events 1..Version applied.
	Version   int64
	CreatedAt time.Time
}

// SaveSnapshot stores the state of key at version (replacing one stored at that
// version). The key must have reached version: streams.ErrInvalidArgument otherwise.
// A snapshot does not change the key's events, so it needs no session; only
// Session.SaveSnapshot checks one.
func (s *Store) SaveSnapshot(ctx context.Context, stream, key string, version int64, snap SnapshotData) error {
	return s.saveSnapshot(ctx, stream, key, version, snap, "")
}

func (s *Store) saveSnapshot(ctx context.Context, stream, key string, version int64, snap SnapshotData, session string) error {
	var data pgtype.Text
	if snap.Data != nil {
		data = pgtype.Text{String: string(snap.Data), Valid: true}
	}
	sess := pgtype.Text{String: session, Valid: session != ""}
	_, err := s.pool.Exec(ctx, "SELECT streamd.save_snapshot($1, $2, $3, $4, $5, $6, $7)",
		stream, key, version, data, snap.Bytes, sess, s.now())
	if err != nil {
		return fmt.Errorf("save snapshot of %s/%s at version %d: %w", stream, key, version, sqlerr.Wrap(err))
	}
	return nil
}

// Load returns the newest snapshot of key (nil when there is none) and the key's
// events after it, in version order: what rebuilding the key's state needs. Both are
// read in one REPEATABLE READ transaction, so they agree with each other. Errors:
// streams.ErrStreamNotFound, ErrNotVersioned.
func (s *Store) Load(ctx context.Context, stream, key string) (*Snapshot, []StoredEvent, error) {
	var snap *Snapshot
	var events []StoredEvent
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// The events' read (s.read) checks the stream: ErrStreamNotFound, ErrNotVersioned.
		var sn Snapshot
		var data []byte
		err := tx.QueryRow(ctx, `SELECT s.key_version, s.data, s.data_bytes, s.created_at FROM streamd.snapshots s
			WHERE s.stream_name = $1 AND s.key = $2 ORDER BY s.key_version DESC LIMIT 1`, stream, key).
			Scan(&sn.Version, &data, &sn.Bytes, &sn.CreatedAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			if data != nil {
				sn.Data = json.RawMessage(data)
			}
			snap = &sn
		}
		after := int64(0)
		if snap != nil {
			after = snap.Version
		}
		events, err = s.read(ctx, tx, stream, key, after, 0)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("load %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	return snap, events, nil
}

var _ streams.DBTX = (pgx.Tx)(nil)

// snapshotVersionsSQL lists a key's snapshot versions (the primary key's order).
const snapshotVersionsSQL = `SELECT s.key_version FROM streamd.snapshots s
 WHERE s.stream_name = $1 AND s.key = $2 ORDER BY s.key_version`

// SnapshotVersions returns the versions at which key has a snapshot, ascending (seed
// 004's snapshot index); empty when it has none. Errors: streams.ErrStreamNotFound,
// streams.ErrInvalidName, ErrNotVersioned.
func (s *Store) SnapshotVersions(ctx context.Context, stream, key string) ([]int64, error) {
	if err := s.checkVersioned(ctx, s.pool, stream); err != nil {
		return nil, fmt.Errorf("snapshot versions of %s/%s: %w", stream, key, err)
	}
	rows, err := s.pool.Query(ctx, snapshotVersionsSQL, stream, key)
	if err != nil {
		return nil, fmt.Errorf("snapshot versions of %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("snapshot versions of %s/%s: %w", stream, key, sqlerr.Wrap(err))
	}
	if out == nil {
		out = []int64{}
	}
	return out, nil
}

// SnapshotAt returns the snapshot of key at exactly version. Errors:
// ErrSnapshotNotFound (none at that version), streams.ErrInvalidArgument (version
// below 1), streams.ErrStreamNotFound, ErrNotVersioned.
func (s *Store) SnapshotAt(ctx context.Context, stream, key string, version int64) (*Snapshot, error) {
	if version < 1 {
		return nil, fmt.Errorf("snapshot of %s/%s at version %d: %w: versions start at 1", stream, key, version, streams.ErrInvalidArgument)
	}
	if err := s.checkVersioned(ctx, s.pool, stream); err != nil {
		return nil, fmt.Errorf("snapshot of %s/%s at version %d: %w", stream, key, version, err)
	}
	sn, err := snapshotAtOrBelow(ctx, s.pool, stream, key, version)
	if err != nil {
		return nil, fmt.Errorf("snapshot of %s/%s at version %d: %w", stream, key, version, sqlerr.Wrap(err))
	}
	if sn == nil || sn.Version != version {
		return nil, fmt.Errorf("snapshot of %s/%s at version %d: %w", stream, key, version, ErrSnapshotNotFound)
	}
	return sn, nil
}

// LoadAt is Load as of version: the newest snapshot at or below version (nil when
// there is none) and the key's events after it up to version, in version order, read
// in one REPEATABLE READ transaction. Rebuilding from them gives the key's state
// after events 1..version. A version past the key's current one reads up to the
// current one. Errors: streams.ErrInvalidArgument (version below 1),
// streams.ErrStreamNotFound, ErrNotVersioned.
func (s *Store) LoadAt(ctx context.Context, stream, key string, version int64) (*Snapshot, []StoredEvent, error) {
	if version < 1 {
		return nil, nil, fmt.Errorf("load %s/%s at version %d: %w: versions start at 1", stream, key, version, streams.ErrInvalidArgument)
	}
	var snap *Snapshot
	var events []StoredEvent
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := s.checkVersioned(ctx, tx, stream); err != nil {
			return err
		}
		var err error
		if snap, err = snapshotAtOrBelow(ctx, tx, stream, key, version); err != nil {
			return err
		}
		after := int64(0)
		if snap != nil {
			after = snap.Version
		}
		if after == version {
			return nil
		}
		events, err = s.read(ctx, tx, stream, key, after, int(version-after))
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("load %s/%s at version %d: %w", stream, key, version, sqlerr.Wrap(err))
	}
	return snap, events, nil
}

// checkVersioned raises what require_key_versions raises for stream.
func (s *Store) checkVersioned(ctx context.Context, db streams.DBTX, stream string) error {
	if _, err := db.Exec(ctx, "SELECT streamd.require_key_versions($1)", stream); err != nil {
		return sqlerr.Wrap(err)
	}
	return nil
}

// snapshotAtOrBelow returns the newest snapshot of key at or below version, nil when
// there is none.
func snapshotAtOrBelow(ctx context.Context, db streams.DBTX, stream, key string, version int64) (*Snapshot, error) {
	var sn Snapshot
	var data []byte
	err := db.QueryRow(ctx, `SELECT s.key_version, s.data, s.data_bytes, s.created_at FROM streamd.snapshots s
		WHERE s.stream_name = $1 AND s.key = $2 AND s.key_version <= $3 ORDER BY s.key_version DESC LIMIT 1`, stream, key, version).
		Scan(&sn.Version, &data, &sn.Bytes, &sn.CreatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	if data != nil {
		sn.Data = json.RawMessage(data)
	}
	return &sn, nil
}
