package consumergroup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// GroupOffset is a group's committed offset (the next offset to read) in one
// partition of one stream: a line of kafka-consumer-groups' --export
// (topic,partition,offset).
type GroupOffset struct {
	Stream    string `json:"stream"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// GroupOffsetChange is one partition's change by SetOffsets.
type GroupOffsetChange struct {
	Stream string `json:"stream"`
	OffsetChange
}

// SetOffsetsOpts are SetOffsets' knobs. A nil *SetOffsetsOpts means the defaults.
type SetOffsetsOpts struct {
	// DryRun computes the changes and returns them without making them, as
	// ResetOpts.DryRun. Defaults to false: the offsets are set.
	DryRun bool
	// Force sets the offsets of a group with live members, expelling them, as
	// ResetOpts.Force. Defaults to false: ErrGroupNotEmpty.
	Force bool
}

// ExportOffsets returns group's committed offsets on every stream, or on stream when
// it is not "", ordered by stream and partition; partitions without a committed offset
// are left out (kafka-consumer-groups --reset-offsets --to-current --export).
// SetOffsets takes them back. ErrGroupNotFound when the group has no such stream.
func (a *Admin) ExportOffsets(ctx context.Context, stream, group string) ([]GroupOffset, error) {
	var out []GroupOffset
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		// One snapshot: the group's existence and its offsets agree.
		if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
			return err
		}
		var groups int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_groups
			WHERE group_id = $1 AND ($2 = '' OR stream_name = $2)`, group, stream).Scan(&groups); err != nil {
			return err
		}
		if groups == 0 {
			return ErrGroupNotFound
		}
		rows, err := tx.Query(ctx, `SELECT stream_name, partition, "offset" FROM streamd.consumer_offsets
			WHERE group_id = $1 AND ($2 = '' OR stream_name = $2) ORDER BY stream_name, partition`, group, stream)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[GroupOffset])
		return err
	})
	if err != nil {
		if stream == "" {
			return nil, fmt.Errorf("export offsets of group %s: %w", group, sqlerr.Wrap(err))
		}
		return nil, fmt.Errorf("export offsets of group %s of %s: %w", group, stream, sqlerr.Wrap(err))
	}
	if out == nil {
		out = []GroupOffset{}
	}
	return out, nil
}

// SetOffsets sets group's committed offsets to the ones given (an export, edited or
// not: kafka-consumer-groups --reset-offsets --from-file), all or nothing, in one
// transaction. Each offset is clamped to its partition's stored log, as ResetToOffset
// clamps. A partition given twice, or a negative offset, is ErrInvalidArgument;
// ErrGroupNotFound when the group does not exist on one of the streams; a partition the
// stream lacks is ErrInvalidArgument; ErrGroupNotEmpty while the group has live members
// on one of the streams unless opts.Force. Nothing is written on an error. The changes
// come back ordered by stream and partition.
func (a *Admin) SetOffsets(ctx context.Context, group string, offsets []GroupOffset, opts *SetOffsetsOpts) ([]GroupOffsetChange, error) {
	o := SetOffsetsOpts{}
	if opts != nil {
		o = *opts
	}
	sorted := slices.Clone(offsets)
	slices.SortFunc(sorted, func(x, y GroupOffset) int {
		return cmp.Or(cmp.Compare(x.Stream, y.Stream), cmp.Compare(x.Partition, y.Partition))
	})
	for i, s := range sorted {
		if i > 0 && sorted[i-1].Stream == s.Stream && sorted[i-1].Partition == s.Partition {
			return nil, fmt.Errorf("set offsets of group %s: %w: partition %d of %s is given twice", group, ErrInvalidArgument, s.Partition, s.Stream)
		}
		if s.Offset < 0 {
			return nil, fmt.Errorf("set offsets of group %s: %w: offset %d for partition %d of %s is negative", group, ErrInvalidArgument, s.Offset, s.Partition, s.Stream)
		}
	}
	var out []GroupOffsetChange
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		// One reset per partition, in stream and partition order, in this one
		// transaction: the first of a stream expels its live members (Force), and a
		// later failure undoes them all.
		for _, s := range sorted {
			var c GroupOffsetChange
			err := tx.QueryRow(ctx, `SELECT partition, previous_offset, new_offset
				FROM streamd.reset_group_offsets($1, $2, 'offset', $3, NULL, ARRAY[$4::integer], $5, NULL)`,
				s.Stream, group, s.Offset, s.Partition, o.Force).Scan(&c.Partition, &c.Previous, &c.New)
			if err != nil {
				return fmt.Errorf("partition %d of %s: %w", s.Partition, s.Stream, sqlerr.Wrap(err))
			}
			c.Stream = s.Stream
			out = append(out, c)
		}
		if o.DryRun {
			return errDryRun // rolls back
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return nil, fmt.Errorf("set offsets of group %s: %w", group, err)
	}
	if out == nil {
		out = []GroupOffsetChange{}
	}
	return out, nil
}
