package streams

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// ErrStreamExists: AddStream of a stream that exists (kafka-topics' "topic exists").
var ErrStreamExists = errors.New("stream already exists")

// createLockClass is the first key of the advisory lock that serialises AddStream
// and GrowStream on one stream ("SDS6"; the second is hashtext(name)).
const createLockClass int32 = 0x53445336

// AddStream creates stream name with partitions partitions, and refuses
// (ErrStreamExists) a stream that exists, whatever its partition count: unlike
// CreateStream it never grows one (growing re-maps keys to partitions, so it is
// GrowStream's, asked for by name). Errors: ErrInvalidName, ErrInvalidArgument.
func (c *Client) AddStream(ctx context.Context, name string, partitions int32) error {
	return c.createOrGrow(ctx, name, partitions, false)
}

// GrowStream grows stream name to partitions partitions (the same count is a no-op).
// Keys hash to partitions by their count, so a key's records after the change may go
// to another partition than before. Errors: ErrStreamNotFound, ErrPartitionsDecrease,
// ErrInvalidName, ErrInvalidArgument.
func (c *Client) GrowStream(ctx context.Context, name string, partitions int32) error {
	return c.createOrGrow(ctx, name, partitions, true)
}

func (c *Client) createOrGrow(ctx context.Context, name string, partitions int32, grow bool) error {
	if err := checkPartitions(name, partitions); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		return createOrGrowTx(ctx, tx, name, partitions, grow)
	})
	if err != nil {
		if grow {
			return fmt.Errorf("grow stream %s: %w", name, sqlerr.Wrap(err))
		}
		return fmt.Errorf("create stream %s: %w", name, sqlerr.Wrap(err))
	}
	return nil
}

func checkPartitions(name string, partitions int32) error {
	if !ValidName(name) {
		return invalid(ErrInvalidName, "stream name %q: use 1 to 249 characters of A-Z a-z 0-9 . _ -", name)
	}
	if partitions < 1 || partitions > 10000 {
		return invalid(ErrInvalidArgument, "stream %s: partition count %d must be between 1 and 10000", name, partitions)
	}
	return nil
}

// createOrGrowTx creates or grows stream name in tx, under the lock that serialises
// AddStream and GrowStream on it.
func createOrGrowTx(ctx context.Context, tx pgx.Tx, name string, partitions int32, grow bool) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2)) IS NOT NULL
		AND EXISTS (SELECT 1 FROM streamd.streams WHERE stream_name = $2)`, createLockClass, name).Scan(&exists); err != nil {
		return err
	}
	switch {
	case exists && !grow:
		return fmt.Errorf("%w: %s (stream alter grows it)", ErrStreamExists, name)
	case !exists && grow:
		return fmt.Errorf("%q: %w", name, ErrStreamNotFound)
	}
	_, err := tx.Exec(ctx, "SELECT streamd.create_stream($1, $2)", name, partitions)
	return err
}

// MaxPayloadLimit is the largest payload limit SetMaxPayloadBytes takes (256 MiB; a
// jsonb value cannot be larger).
const MaxPayloadLimit = 256 << 20

// SetMaxPayloadBytes sets stream name's payload limit (max_payload_bytes: an event's
// data, bytes and headers). Appends check it in SQL at once; a Producer that loaded
// the stream's metadata before checks the old limit on its side until it reloads it.
// Errors: ErrStreamNotFound, ErrInvalidName, ErrInvalidArgument (outside 1 to
// MaxPayloadLimit); nothing is written then.
func (c *Client) SetMaxPayloadBytes(ctx context.Context, name string, n int32) error {
	if err := checkPayloadLimit(name, n); err != nil {
		return err
	}
	tag, err := c.pool.Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = $2 WHERE stream_name = $1", name, n)
	if err != nil {
		return fmt.Errorf("set payload limit of %s: %w", name, sqlerr.Wrap(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set payload limit of %q: %w", name, ErrStreamNotFound)
	}
	return nil
}

func checkPayloadLimit(name string, n int32) error {
	if !ValidName(name) {
		return invalid(ErrInvalidName, "stream name %q: use 1 to 249 characters of A-Z a-z 0-9 . _ -", name)
	}
	if n < 1 || n > MaxPayloadLimit {
		return invalid(ErrInvalidArgument, "stream %s: payload limit %d bytes must be between 1 and %d", name, n, MaxPayloadLimit)
	}
	return nil
}

// AlterStreamOpts are AlterStream's changes; a nil field keeps the stream's value.
type AlterStreamOpts struct {
	// MaxPayloadBytes is the new payload limit, as SetMaxPayloadBytes sets it.
	// Defaults to nil: kept.
	MaxPayloadBytes *int32
	// Partitions is the new partition count, as GrowStream grows it. Defaults to
	// nil: kept.
	Partitions *int32
}

// AlterStream grows stream name and sets its payload limit in one transaction: both
// changes or neither (a grow refused after the limit was set left the limit set).
// Errors: those of GrowStream and SetMaxPayloadBytes, and ErrInvalidArgument for
// opts that change nothing; nothing is written then.
func (c *Client) AlterStream(ctx context.Context, name string, opts *AlterStreamOpts) error {
	if opts == nil || (opts.Partitions == nil && opts.MaxPayloadBytes == nil) {
		return invalid(ErrInvalidArgument, "alter stream %s: give the partition count or the payload limit", name)
	}
	if p := opts.Partitions; p != nil {
		if err := checkPartitions(name, *p); err != nil {
			return err
		}
	}
	if n := opts.MaxPayloadBytes; n != nil {
		if err := checkPayloadLimit(name, *n); err != nil {
			return err
		}
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if p := opts.Partitions; p != nil {
			if err := createOrGrowTx(ctx, tx, name, *p, true); err != nil {
				return sqlerr.Wrap(err)
			}
		}
		if n := opts.MaxPayloadBytes; n != nil {
			return SetMaxPayloadBytesTx(ctx, tx, name, *n)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("alter stream %s: %w", name, err)
	}
	return nil
}
