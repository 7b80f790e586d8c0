package consumergroup

import (
	"context"
	"fmt"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

func setPaused(ctx context.Context, db streams.DBTX, stream, group string, partitions []int32, paused bool) error {
	if len(partitions) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, "SELECT streamd.set_partitions_paused($1, $2, $3, $4)", stream, group, partitions, paused)
	if err != nil {
		return fmt.Errorf("set paused=%v for %v of group %s of %s: %w", paused, partitions, group, stream, sqlerr.Wrap(err))
	}
	return nil
}
