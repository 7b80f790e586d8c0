package consumergroup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/streamd/streamd/internal/backoff"
)

// listen holds a dedicated connection LISTENing on the group's channel and wakes the
// session loop on every notification (assignment changed, member joined or left), so
// members react well under a heartbeat interval; a 'redeliver' notification (a dead
// letter replayed) tells the workers instead (Consumer.redeliverGen). It reconnects with backoff, waking
// the loop after each (re)connect since notifications may have been missed. Owned by
// Run; returns when ctx ends.
func (c *Consumer) listen(ctx context.Context) {
	channel := pgx.Identifier{groupChannel(c.cfg.Stream, c.cfg.Group)}.Sanitize()
	b := backoff.NewJittered(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, c.pool.Config().ConnConfig.Copy())
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+channel)
		}
		if err == nil {
			b.Reset()
			c.redeliverGen.Add(1) // a replay may have been missed while not listening
			c.signal()
			for err == nil {
				var n *pgconn.Notification
				n, err = conn.WaitForNotification(ctx)
				if err == nil {
					if n.Payload == "redeliver" {
						c.redeliverGen.Add(1) // the workers look; the session has nothing to do
						continue
					}
					c.signal()
				}
			}
		}
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		c.log.Debug("group listener reconnecting", "error", err)
		b.Wait(ctx)
	}
}
