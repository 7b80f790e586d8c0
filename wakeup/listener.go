package wakeup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/promreg"
)

// Payload format of a notification on Channel: lines of "s <partitions> <name>" (a
// stream; partitions comma-separated) or "q <name>" (a queue), or a single "*"
// (wake everyone: wake-ups may have been missed). Names never contain a newline (nor
// a space: [A-Za-z0-9._-]).
const (
	payloadAll = "*"
	maxPayload = 7900 // NOTIFY payloads must stay under 8000 bytes
)

// encodeStream returns the lines for partitions of stream, split so that each line
// fits in a payload.
func encodeStream(stream string, partitions []int32) []string {
	var lines []string
	var b strings.Builder
	for _, p := range partitions {
		ps := strconv.FormatInt(int64(p), 10)
		if b.Len() > 0 && b.Len()+1+len(ps)+1+len(stream) > maxPayload {
			lines = append(lines, "s "+b.String()+" "+stream)
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(ps)
	}
	if b.Len() > 0 {
		lines = append(lines, "s "+b.String()+" "+stream)
	}
	return lines
}

func encodeQueue(queue string) string { return "q " + queue }

// decodePayload calls onStream and onQueue for each line of payload; all is true for
// "*". Malformed lines are skipped.
func decodePayload(payload string, onStream func(stream string, partitions ...int32), onQueue func(queue string)) (all bool) {
	if payload == payloadAll {
		return true
	}
	var parts []int32
	for line := range strings.SplitSeq(payload, "\n") {
		if len(line) < 3 || line[1] != ' ' {
			continue
		}
		switch line[0] {
		case 's':
			csv, name, ok := strings.Cut(line[2:], " ")
			if !ok || name == "" {
				continue
			}
			parts = parts[:0]
			for f := range strings.SplitSeq(csv, ",") {
				if p, err := strconv.ParseInt(f, 10, 32); err == nil && p >= 0 {
					parts = append(parts, int32(p))
				}
			}
			if len(parts) > 0 {
				onStream(name, parts...)
			}
		case 'q':
			onQueue(line[2:])
		}
	}
	return false
}

// ListenerConfig configures a Listener. Fields are alphabetical.
type ListenerConfig struct {
	// ConnString is the PostgreSQL connection string of the database whose
	// Broadcaster to listen to. Required.
	ConnString string
	// Logger receives lifecycle messages. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxBackoff bounds the wait between reconnection attempts. Defaults to 5s.
	MaxBackoff time.Duration
	// MinBackoff is the first wait before reconnecting. Defaults to 50ms.
	MinBackoff time.Duration
	// Registerer receives the listener's metrics. Defaults to nil: no metrics.
	Registerer prometheus.Registerer
}

func (c *ListenerConfig) withDefaults() (ListenerConfig, error) {
	out := ListenerConfig{}
	if c != nil {
		out = *c
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
	return out, out.validate()
}

func (c *ListenerConfig) validate() error {
	switch {
	case c.ConnString == "":
		return errors.New("wakeup: ListenerConfig.ConnString is required")
	case c.MinBackoff < 0:
		return fmt.Errorf("wakeup: ListenerConfig.MinBackoff %v is negative", c.MinBackoff)
	case c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("wakeup: ListenerConfig.MaxBackoff %v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

// Listener is the process's one LISTEN connection: a Hub fed by the Broadcaster's
// notifications. Subscribe through the embedded Hub; Run may be called again
// after it returned, never concurrently.
type Listener struct {
	*Hub
	cfg       ListenerConfig
	connected atomic.Bool
	mConn     prometheus.Gauge
	mReceived prometheus.Counter
}

// NewListener checks cfg and returns a Listener. It does not connect.
func NewListener(cfg *ListenerConfig) (*Listener, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Listener{
		Hub: NewHub(),
		cfg: c,
		mConn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "streamd_wakeup_listener_connected",
			Help: "1 while the wake-up listener's LISTEN connection is up, else 0.",
		}),
		mReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_wakeup_notifications_received_total",
			Help: "Wake-up notifications received by the listener.",
		}),
	}
	if err := errors.Join(promreg.Register(c.Registerer, &l.mConn), promreg.Register(c.Registerer, &l.mReceived)); err != nil {
		return nil, fmt.Errorf("wakeup: %w", err)
	}
	return l, nil
}

func (l *Listener) notifyQueue(queue string) { l.Notify(KindQueue, queue) }

// Connected reports whether the LISTEN connection is up. Safe from any goroutine.
func (l *Listener) Connected() bool { return l.connected.Load() }

// Run holds the LISTEN connection until ctx ends, reconnecting with backoff, and
// returns nil then. After every (re)connect it wakes every subscriber, since
// notifications sent meanwhile were missed. It returns an error only for a bad
// connection string.
func (l *Listener) Run(ctx context.Context) error {
	// Parsed as a pool's string so that pool_* settings are accepted and dropped.
	poolCfg, err := pgxpool.ParseConfig(l.cfg.ConnString)
	if err != nil {
		return fmt.Errorf("wakeup: parse ListenerConfig.ConnString: %w", err)
	}
	connCfg := poolCfg.ConnConfig
	l.cfg.Logger.Info("wakeup listener started")
	defer l.cfg.Logger.Info("wakeup listener stopped")
	bo := backoff.NewJittered(l.cfg.MinBackoff, l.cfg.MaxBackoff)
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, connCfg.Copy())
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{Channel}.Sanitize())
		}
		if err == nil {
			bo.Reset()
			l.NotifyAll() // before Connected: who subscribes after it needs no wake-up
			l.connected.Store(true)
			l.mConn.Set(1)
			for err == nil {
				var n *pgconn.Notification
				n, err = conn.WaitForNotification(ctx)
				if err == nil {
					l.mReceived.Inc()
					if decodePayload(n.Payload, l.NotifyPartitions, l.notifyQueue) {
						l.NotifyAll()
					}
				}
			}
			l.connected.Store(false)
			l.mConn.Set(0)
		}
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
		if ctx.Err() != nil {
			break
		}
		wait := bo.Next()
		l.cfg.Logger.Debug("wakeup listener reconnecting", "error", err, "backoff", wait)
		if !backoff.Sleep(ctx, wait) {
			break
		}
	}
	return nil
}
