package messages

import (
	"context"
	"fmt"
	"time"

	"github.com/streamd/streamd/internal/sqlerr"
)

// QueueUpdate names the settings SetQueue changes. A nil field keeps the queue's
// setting, or takes the default (see QueueConfig) when the queue is new.
type QueueUpdate struct {
	// DeadLetterQueue, when set, replaces the dead-letter queue; "" removes it.
	DeadLetterQueue *string
	// FIFO, when set, must match an existing queue's type (it cannot change).
	FIFO *bool
	// MaxDeliveryAttempts, when set, must be at least 1.
	MaxDeliveryAttempts *int
	// MaxPayloadBytes, when set, must be between 1 and 67108864.
	MaxPayloadBytes *int
	// VisibilityTimeout, when set, must be at least 1ms.
	VisibilityTimeout *time.Duration
}

// SetQueue changes the settings u gives of queue name, or creates the queue with
// them (and the defaults for the others), and returns the queue as it now is. The
// read of the current settings and the write are one statement, serialised with the
// other SetQueue calls on the queue, so two calls that change different settings
// both take effect. A nil u creates the queue with the defaults, or changes nothing.
// Errors: ErrInvalidName, ErrInvalidArgument (naming the setting), ErrQueueNotFound
// (for the dead-letter queue); nothing is written then.
func (c *Client) SetQueue(ctx context.Context, name string, u *QueueUpdate) (*QueueInfo, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	o := QueueUpdate{}
	if u != nil {
		o = *u
	}
	var (
		vtMS     *int64
		attempts *int
		payload  *int
		dlq      *string
	)
	if v := o.MaxDeliveryAttempts; v != nil {
		if *v < 1 {
			return nil, invalid(ErrInvalidArgument, "queue %s: max delivery attempts %d must be at least 1", name, *v)
		}
		attempts = v
	}
	if v := o.MaxPayloadBytes; v != nil {
		if *v < 1 || *v > 64<<20 {
			return nil, invalid(ErrInvalidArgument, "queue %s: max payload %d bytes must be between 1 and 67108864", name, *v)
		}
		payload = v
	}
	if v := o.VisibilityTimeout; v != nil {
		if *v < time.Millisecond {
			return nil, invalid(ErrInvalidArgument, "queue %s: visibility timeout %v must be at least 1ms", name, *v)
		}
		ms := v.Milliseconds()
		vtMS = &ms
	}
	if v := o.DeadLetterQueue; v != nil && *v != "" {
		if !ValidName(*v) {
			return nil, invalid(ErrInvalidName, "queue %s: dead-letter queue %q is not a valid queue name", name, *v)
		}
		if *v == name {
			return nil, invalid(ErrInvalidArgument, "queue %s cannot be its own dead-letter queue", name)
		}
		dlq = v
	}
	q, err := scanQueue(c.pool.QueryRow(ctx, "SELECT "+queueColumns+" FROM streamd.queue_set($1, $2, $3, $4, $5, $6, $7)",
		name, o.FIFO, vtMS, attempts, o.DeadLetterQueue != nil, dlq, payload))
	if err != nil {
		return nil, fmt.Errorf("set queue %s: %w", name, sqlerr.Wrap(err))
	}
	return &q, nil
}
