package consumergroup

import (
	"context"
	"time"

	"github.com/streamd/streamd/streamconfig"
)

// unsetFields records which Config fields the caller left at their zero value, so
// that the stream's settings (stream_configurations: performance_config and
// dead_letter_config, docs/retention.md) may fill them: a value set in Config wins.
type unsetFields struct {
	batch, retries, backoff, policy bool
}

func unsetOf(cfg Config) unsetFields {
	return unsetFields{
		batch:   cfg.MaxBatchSize == 0,
		retries: cfg.MaxRetries == 0,
		backoff: cfg.RetryBackoff == 0,
		policy:  cfg.OnHandlerError == ErrorBlock,
	}
}

// applyStreamSettings reads the stream's configuration and applies it to the fields
// the caller left unset: performance_config.batchSize (MaxBatchSize),
// dead_letter_config.enabled (OnHandlerError = ErrorDeadLetter), maxDeliveryAttempts
// (MaxRetries = attempts - 1) and backoff (RetryBackoff). Run calls it before it
// starts any goroutine, so c.cfg has no concurrent reader. A configuration that
// cannot be read (the database is down, the stream is missing) leaves the defaults:
// Run's join reports what is wrong.
func (c *Consumer) applyStreamSettings(ctx context.Context) {
	sc, err := streamconfig.GetTx(ctx, c.pool, c.cfg.Stream)
	if err != nil {
		c.log.Debug("stream settings not read", "error", err)
		return
	}
	u := c.unset
	if p := sc.Performance; p != nil && p.BatchSize > 0 && u.batch {
		c.cfg.MaxBatchSize = p.BatchSize
	}
	if d := sc.DeadLetter; d != nil {
		if d.Enabled && u.policy {
			c.cfg.OnHandlerError = ErrorDeadLetter
		}
		if d.MaxDeliveryAttempts > 0 && u.retries {
			c.cfg.MaxRetries = d.MaxDeliveryAttempts - 1
			if c.cfg.MaxRetries == 0 {
				c.cfg.MaxRetries = NoRetries
			}
		}
		if d.Backoff != nil && *d.Backoff > 0 && u.backoff {
			c.cfg.RetryBackoff = time.Duration(*d.Backoff)
			c.cfg.RetryBackoffMax = max(c.cfg.RetryBackoffMax, c.cfg.RetryBackoff)
		}
	}
}
