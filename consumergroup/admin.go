package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// Admin inspects and administers consumer groups (kafka-consumer-groups.sh). It is
// safe for concurrent use.
type Admin struct {
	pool *pgxpool.Pool
}

// NewAdmin returns an Admin on pool.
func NewAdmin(pool *pgxpool.Pool) *Admin { return &Admin{pool: pool} }

// GroupSummary describes a group in a listing.
type GroupSummary struct {
	Stream       string    `json:"stream"`
	Group        string    `json:"group"`
	GroupEpoch   int64     `json:"group_epoch"`
	Members      int       `json:"members"`
	Partitions   int       `json:"partitions"`
	PendingMoves int       `json:"pending_moves"`
	Lag          int64     `json:"lag"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// PartitionStatus is one partition of a group, as Describe reports it.
type PartitionStatus struct {
	Partition int32 `json:"partition"`
	// CommittedOffset is the group's committed offset (next to read); nil when none.
	CommittedOffset *int64 `json:"committed_offset"`
	LogStartOffset  int64  `json:"log_start_offset"`
	// LogEndOffset is the offset the next event gets.
	LogEndOffset int64 `json:"log_end_offset"`
	// Lag is LogEndOffset minus the committed offset (or the log start when none).
	Lag int64 `json:"lag"`
	// Owner is the member that owns the partition, "" when none; PendingOwner the
	// member it is moving to.
	Owner        string `json:"owner,omitempty"`
	OwnerEpoch   *int64 `json:"owner_epoch,omitempty"`
	PendingOwner string `json:"pending_owner,omitempty"`
	Paused       bool   `json:"paused"`
}

// MemberStatus is one member of a group.
type MemberStatus struct {
	ConsumerID    string    `json:"consumer_id"`
	InstanceID    string    `json:"instance_id,omitempty"`
	MemberEpoch   int64     `json:"member_epoch"`
	RegisteredAt  time.Time `json:"registered_at"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	Stale         bool      `json:"stale"`
}

// GroupDescription is a group's partitions and members.
type GroupDescription struct {
	GroupSummary
	PartitionStatus []PartitionStatus `json:"partition_status"`
	MemberStatus    []MemberStatus    `json:"member_status"`
}

// ListGroups returns every group, of one stream when stream is not "".
func (a *Admin) ListGroups(ctx context.Context, stream string) ([]GroupSummary, error) {
	rows, err := a.pool.Query(ctx, `SELECT stream_name, group_id, group_epoch, members, partitions, pending_moves, lag, updated_at
		FROM streamd.consumer_group_summary WHERE ($1 = '' OR stream_name = $1) ORDER BY stream_name, group_id`, stream)
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GroupSummary, error) {
		var g GroupSummary
		err := r.Scan(&g.Stream, &g.Group, &g.GroupEpoch, &g.Members, &g.Partitions, &g.PendingMoves, &g.Lag, &g.UpdatedAt)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", sqlerr.Wrap(err))
	}
	return out, nil
}

// DescribeGroup returns a group's partitions (committed offset, log end, lag, owner)
// and members. ErrGroupNotFound when there is no such group.
func (a *Admin) DescribeGroup(ctx context.Context, stream, group string) (*GroupDescription, error) {
	var d GroupDescription
	err := a.pool.QueryRow(ctx, `SELECT stream_name, group_id, group_epoch, members, partitions, pending_moves, lag, updated_at
		FROM streamd.consumer_group_summary WHERE stream_name = $1 AND group_id = $2`, stream, group).
		Scan(&d.Stream, &d.Group, &d.GroupEpoch, &d.Members, &d.Partitions, &d.PendingMoves, &d.Lag, &d.UpdatedAt)
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("describe group %s of %s: %w", group, stream, ErrGroupNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("describe group %s of %s: %w", group, stream, sqlerr.Wrap(err))
	}
	rows, err := a.pool.Query(ctx, `SELECT partition, current_offset, log_start_offset, stream_head, lag,
		coalesce(consumer_id, ''), member_epoch, coalesce(pending_owner, ''), paused
		FROM streamd.consumer_group_status WHERE stream_name = $1 AND group_id = $2 AND partition IS NOT NULL ORDER BY partition`, stream, group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s of %s: %w", group, stream, err)
	}
	d.PartitionStatus, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionStatus, error) {
		var p PartitionStatus
		err := r.Scan(&p.Partition, &p.CommittedOffset, &p.LogStartOffset, &p.LogEndOffset, &p.Lag,
			&p.Owner, &p.OwnerEpoch, &p.PendingOwner, &p.Paused)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("describe group %s of %s: %w", group, stream, sqlerr.Wrap(err))
	}
	rows, err = a.pool.Query(ctx, `SELECT consumer_id, coalesce(instance_id, ''), member_epoch, registered_at, last_heartbeat,
		last_heartbeat + session_timeout_ms * interval '1 millisecond' < now()
		FROM streamd.consumer_registrations WHERE stream_name = $1 AND group_id = $2 ORDER BY consumer_id`, stream, group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s of %s: %w", group, stream, err)
	}
	d.MemberStatus, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (MemberStatus, error) {
		var m MemberStatus
		err := r.Scan(&m.ConsumerID, &m.InstanceID, &m.MemberEpoch, &m.RegisteredAt, &m.LastHeartbeat, &m.Stale)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("describe group %s of %s: %w", group, stream, err)
	}
	return &d, nil
}

// ResetMode is how ResetOffsets computes the new offsets.
type ResetMode string

// The reset modes (kafka-consumer-groups --reset-offsets --to-earliest, ...).
const (
	ResetToEarliest  ResetMode = "earliest"
	ResetToLatest    ResetMode = "latest"
	ResetToTimestamp ResetMode = "timestamp"
	ResetToOffset    ResetMode = "offset"
	ResetShiftBy     ResetMode = "shift"
)

// ResetOpts is what ResetOffsets does.
type ResetOpts struct {
	// DryRun computes the changes and returns them without making them (the reset
	// runs in a transaction that is rolled back, so it reports what Force or a live
	// member would do, too). Defaults to false: the reset is made.
	DryRun bool
	// Force resets a group that has live members: they are expelled (their commits
	// are fenced) and start from the new offsets when they join again.
	Force bool
	// Mode is required.
	Mode ResetMode
	// Partitions limits the reset; nil means all, an empty slice none (nothing is
	// reset and, even with Force, nobody is expelled).
	Partitions []int32
	// Time is the timestamp for ResetToTimestamp.
	Time time.Time
	// Value is the offset for ResetToOffset or the shift (may be negative) for
	// ResetShiftBy. New offsets are clamped to the stored log, whatever the value
	// (math.MaxInt64 shifts to the log end).
	Value int64
}

// OffsetChange is one partition's reset.
type OffsetChange struct {
	Partition int32  `json:"partition"`
	Previous  *int64 `json:"previous_offset"`
	New       int64  `json:"new_offset"`
}

// errDryRun rolls back a dry run's transaction.
var errDryRun = errors.New("dry run")

// ResetOffsets sets a group's committed offsets (or, with opts.DryRun, says how it
// would set them). ErrGroupNotEmpty while the group has
// live members unless opts.Force; ErrGroupNotFound, ErrInvalidArgument for bad input
// (nothing is written then).
func (a *Admin) ResetOffsets(ctx context.Context, stream, group string, opts ResetOpts) ([]OffsetChange, error) {
	var t *time.Time
	if opts.Mode == ResetToTimestamp {
		t = &opts.Time
	}
	var parts []int32
	if opts.Partitions != nil {
		parts = opts.Partitions
	}
	var out []OffsetChange
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT partition, previous_offset, new_offset
			FROM streamd.reset_group_offsets($1, $2, $3, $4, $5, $6, $7, NULL)`,
			stream, group, string(opts.Mode), opts.Value, t, parts, opts.Force)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (OffsetChange, error) {
			var c OffsetChange
			err := r.Scan(&c.Partition, &c.Previous, &c.New)
			return c, err
		})
		if err == nil && opts.DryRun {
			return errDryRun // rolls back
		}
		return err
	})
	if errors.Is(err, errDryRun) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reset offsets of group %s of %s: %w", group, stream, sqlerr.Wrap(err))
	}
	return out, nil
}

// DeleteGroup deletes a group with its members, ownership and committed offsets.
// ErrInvalidGroupID for a malformed group id; ErrGroupNotFound when there is no such
// group; ErrGroupNotEmpty while it has live members unless force.
func (a *Admin) DeleteGroup(ctx context.Context, stream, group string, force bool) error {
	var ok bool
	err := a.pool.QueryRow(ctx, "SELECT streamd.delete_group($1, $2, $3, NULL)", stream, group, force).Scan(&ok)
	if err != nil {
		return fmt.Errorf("delete group %s of %s: %w", group, stream, sqlerr.Wrap(err))
	}
	if !ok {
		return fmt.Errorf("delete group %s of %s: %w", group, stream, ErrGroupNotFound)
	}
	return nil
}

// Pause stops the group processing the partitions until Resume (whichever member owns
// them, across handovers).
func (a *Admin) Pause(ctx context.Context, stream, group string, partitions ...int32) error {
	return setPaused(ctx, a.pool, stream, group, partitions, true, false)
}

// Resume undoes Pause.
func (a *Admin) Resume(ctx context.Context, stream, group string, partitions ...int32) error {
	return setPaused(ctx, a.pool, stream, group, partitions, false, false)
}

// setPaused pauses or resumes partitions of a group; create makes the group when it
// does not exist (a Consumer pausing before it joined), else that is ErrGroupNotFound.
func setPaused(ctx context.Context, db streams.DBTX, stream, group string, partitions []int32, paused, create bool) error {
	if len(partitions) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, "SELECT streamd.set_partitions_paused($1, $2, $3, $4, $5)", stream, group, partitions, paused, create)
	if err != nil {
		return fmt.Errorf("set paused=%v for %v of group %s of %s: %w", paused, partitions, group, stream, sqlerr.Wrap(err))
	}
	return nil
}

// DeadLetter is an event a group's handler gave up on (seeds 000 and 001). Status is
// pending (waiting for an operator), replayed (redelivered, or to be redelivered, to
// its group only: RedeliveredAt says when its handler took it), discarded, or resolved
// (dealt with by hand, without replay); ResolvedAt and ResolvedBy say when and who.
// There is one per (group, event): the event failing again after a replay adds to
// Attempts and makes it pending again.
type DeadLetter struct {
	ID             int64           `json:"id"`
	Stream         string          `json:"stream"`
	Group          string          `json:"group"`
	Partition      int32           `json:"partition"`
	Offset         int64           `json:"offset"`
	EventID        string          `json:"event_id"`
	EventType      string          `json:"event_type"`
	Key            string          `json:"key,omitempty"`
	Data           json.RawMessage `json:"data,omitempty"`
	Error          string          `json:"error"`
	ErrorDetail    string          `json:"error_detail,omitempty"`
	Attempts       int             `json:"attempts"`
	FirstFailureAt time.Time       `json:"first_failure_at"`
	LastFailureAt  time.Time       `json:"last_failure_at"`
	Status         string          `json:"status"`
	ResolvedAt     *time.Time      `json:"resolved_at,omitempty"`
	ResolvedBy     string          `json:"resolved_by,omitempty"`
	RedeliveredAt  *time.Time      `json:"redelivered_at,omitempty"`
}

// The statuses of a dead letter (DeadLetter.Status), for groups and queues alike.
const (
	DeadLetterPending   = "pending"
	DeadLetterReplayed  = "replayed"
	DeadLetterDiscarded = "discarded"
	DeadLetterResolved  = "resolved"
)

// DeadLetters lists a stream's dead letters of group ("" for all groups) with status
// ("" for all), oldest first. ErrInvalidArgument for an unknown status.
func (a *Admin) DeadLetters(ctx context.Context, stream, group, status string) ([]DeadLetter, error) {
	switch status {
	case "", DeadLetterPending, DeadLetterReplayed, DeadLetterDiscarded, DeadLetterResolved:
	default:
		return nil, fmt.Errorf("%w: dead letter status %q: want pending, replayed, discarded or resolved", ErrInvalidArgument, status)
	}
	rows, err := a.pool.Query(ctx, `SELECT id, stream_name, group_id, partition, "offset", event_id, event_type,
		coalesce(key, ''), data, error, coalesce(error_detail, ''), attempts, first_failure_at, last_failure_at, status,
		resolved_at, coalesce(resolved_by, ''), redelivered_at
		FROM streamd.dead_letter_queue WHERE stream_name = $1 AND ($2 = '' OR group_id = $2) AND ($3 = '' OR status = $3)
		ORDER BY id`, stream, group, status)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of %s: %w", stream, sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var data []byte
		err := r.Scan(&d.ID, &d.Stream, &d.Group, &d.Partition, &d.Offset, &d.EventID, &d.EventType, &d.Key, &data,
			&d.Error, &d.ErrorDetail, &d.Attempts, &d.FirstFailureAt, &d.LastFailureAt, &d.Status, &d.ResolvedAt,
			&d.ResolvedBy, &d.RedeliveredAt)
		d.Data = data
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters of %s: %w", stream, sqlerr.Wrap(err))
	}
	return out, nil
}

// ReplayDeadLetter redelivers a pending dead letter to its group only: it is marked
// replayed by resolvedBy, and the member that owns its partition in that group hands
// it to its handler before its next fetch (Batch.Redelivered), as stored (same
// partition, offset, id and payload). Nothing is appended to the stream: no other
// group sees it. A group without live members gets it when a member owns the
// partition again. ErrDeadLetterNotFound when it is not pending.
func (a *Admin) ReplayDeadLetter(ctx context.Context, stream string, id int64, resolvedBy string) error {
	return settleDeadLetter(ctx, a.pool, stream, id, DeadLetterReplayed, resolvedBy)
}

// DiscardDeadLetter marks a pending dead letter discarded by resolvedBy.
// ErrDeadLetterNotFound when it is not pending.
func (a *Admin) DiscardDeadLetter(ctx context.Context, stream string, id int64, resolvedBy string) error {
	return settleDeadLetter(ctx, a.pool, stream, id, DeadLetterDiscarded, resolvedBy)
}

// ResolveDeadLetter marks a pending dead letter resolved by resolvedBy: dealt with
// without a replay (seed 000's resolved). ErrDeadLetterNotFound when it is not
// pending.
func (a *Admin) ResolveDeadLetter(ctx context.Context, stream string, id int64, resolvedBy string) error {
	return settleDeadLetter(ctx, a.pool, stream, id, DeadLetterResolved, resolvedBy)
}
