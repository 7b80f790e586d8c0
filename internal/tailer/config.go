package tailer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/advisory"
)

// DefaultPublication is the publication created by migration 0006.
const DefaultPublication = "streamd_wakeups"

// Kind says whether a Target is a log stream (streamd.events) or a queue
// (streamd.queue_messages).
type Kind uint8

const (
	// KindStream is a stream of the persistent log; Target.Partition is set.
	KindStream Kind = iota + 1
	// KindQueue is a queue; Target.Partition is 0.
	KindQueue
)

// String returns "stream" or "queue".
func (k Kind) String() string {
	switch k {
	case KindStream:
		return "stream"
	case KindQueue:
		return "queue"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Target is one place a committed transaction inserted into.
type Target struct {
	Kind      Kind
	Name      string
	Partition int32
}

// Event is what the tailer hands its Handler.
type Event struct {
	// All is true after the tailer (re)started streaming: commits made while it was
	// not streaming were missed, so every reader should look. Targets is empty then.
	All bool
	// Targets are the distinct (stream, partition) and queues one committed
	// transaction inserted into, in first-insert order.
	Targets []Target
	// CommitTime is the transaction's commit time on the server (zero when All).
	CommitTime time.Time
	// EndLSN is the WAL position just past the transaction's commit record (zero
	// when All). The tailer confirms it to the server after the handler returns.
	EndLSN uint64
}

// Config configures a Tailer. Fields are alphabetical.
type Config struct {
	// Advisories receives the advisories of the tailer's facts: falling back to
	// polling (advisory.TypeTailerPolling, once per change of cause) and losing its
	// replication connection and slot after streaming (advisory.TypeTailerSlotLost).
	// Publishing never blocks the tailer. Defaults to nil: none.
	Advisories *advisory.Publisher
	// ApplicationName is the replication connection's application_name, which shows
	// in pg_stat_replication. Defaults to "streamd-tailer".
	ApplicationName string
	// ConnString is the PostgreSQL connection string (URL or keyword/value) of the
	// database to tail; the tailer adds replication=database itself. Required.
	ConnString string
	// Handler receives every event, on the tailer's goroutine, one at a time. It must
	// not block for long: the tailer reads no WAL and confirms nothing while it runs.
	// What the handler returned for is what the tailer confirms. Required.
	Handler func(ctx context.Context, ev Event)
	// Logger receives lifecycle messages. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxBackoff bounds the wait between reconnection attempts. Defaults to 5s.
	MaxBackoff time.Duration
	// MinBackoff is the first wait before reconnecting. Defaults to 50ms.
	MinBackoff time.Duration
	// Publication is the publication to read. Defaults to DefaultPublication.
	Publication string
	// Registerer receives the tailer's metrics. Defaults to nil: no metrics.
	Registerer prometheus.Registerer
	// StatusInterval is the time between standby status updates, which confirm the
	// handled position; it must stay well under the server's wal_sender_timeout.
	// Defaults to 10s.
	StatusInterval time.Duration
	// UnsupportedRetry is how often the tailer tries again when it cannot run at
	// all (wal_level is not logical, the role may not replicate, or the publication
	// is missing and may not be created); polling is the only path meanwhile.
	// Defaults to 1m.
	UnsupportedRetry time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.ApplicationName == "" {
		out.ApplicationName = "streamd-tailer"
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.MaxBackoff == 0 {
		out.MaxBackoff = 5 * time.Second
	}
	if out.MinBackoff == 0 {
		out.MinBackoff = 50 * time.Millisecond
	}
	if out.Publication == "" {
		out.Publication = DefaultPublication
	}
	if out.StatusInterval == 0 {
		out.StatusInterval = 10 * time.Second
	}
	if out.UnsupportedRetry == 0 {
		out.UnsupportedRetry = time.Minute
	}
	return out, out.validate()
}

func (c *Config) validate() error {
	switch {
	case c.ConnString == "":
		return errors.New("tailer: Config.ConnString is required")
	case c.Handler == nil:
		return errors.New("tailer: Config.Handler is required")
	case c.MinBackoff < 0:
		return fmt.Errorf("tailer: Config.MinBackoff %v is negative", c.MinBackoff)
	case c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("tailer: Config.MaxBackoff %v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	case c.StatusInterval < 0:
		return fmt.Errorf("tailer: Config.StatusInterval %v is negative", c.StatusInterval)
	case c.UnsupportedRetry < 0:
		return fmt.Errorf("tailer: Config.UnsupportedRetry %v is negative", c.UnsupportedRetry)
	}
	return nil
}
