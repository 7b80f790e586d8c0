package consumergroup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PartitionLag is one partition's lag in one group: the log end minus the group's
// committed offset (G5), or the whole retained log when nothing is committed.
type PartitionLag struct {
	Stream    string `json:"stream"`
	Group     string `json:"group"`
	Partition int32  `json:"partition"`
	Lag       int64  `json:"lag"`
}

// Lags returns the lag of every partition of every group (the consumer_group_status
// view), by stream, group and partition.
func (a *Admin) Lags(ctx context.Context) ([]PartitionLag, error) {
	rows, err := a.pool.Query(ctx, `SELECT stream_name, group_id, partition, lag FROM streamd.consumer_group_status WHERE partition IS NOT NULL
		ORDER BY stream_name, group_id, partition`)
	if err != nil {
		return nil, fmt.Errorf("read group lags: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionLag, error) {
		var l PartitionLag
		err := r.Scan(&l.Stream, &l.Group, &l.Partition, &l.Lag)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("read group lags: %w", err)
	}
	return out, nil
}

// ExpireStaleMembers removes every member of every group that missed its session
// timeout (G3) and hands its partitions over, and returns how many it removed. streamd
// serve's leader calls it every --reaper-interval; members' own heartbeats expire
// their group's stale members too, so it matters for groups nobody heartbeats in.
func (a *Admin) ExpireStaleMembers(ctx context.Context) (int, error) {
	var n int
	if err := a.pool.QueryRow(ctx, "SELECT streamd.cleanup_stale_consumers()").Scan(&n); err != nil {
		return 0, fmt.Errorf("expire stale members: %w", err)
	}
	return n, nil
}
