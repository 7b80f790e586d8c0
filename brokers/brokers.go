// Package brokers is the registry of the streamd instances that serve the Kafka
// protocol. Each instance heartbeats Config.Slots rows of its advertised address in
// streamd.kafka_brokers, each a broker identity (node id) of its own; the rows that
// have not expired are the live brokers that Kafka's Metadata lists. Every live broker
// can lead every partition: they all read and write the same database. Several
// identities per instance let a Kafka client, which keeps one fetch in flight per
// broker, fetch the partitions led by different identities independently.
package brokers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Broker is one live instance.
type Broker struct {
	NodeID int32
	Host   string
	Port   int32
	// Rack is nil when the instance gave none.
	Rack *string
}

// Config configures a Registration. A nil *Config means the defaults.
type Config struct {
	// Interval is how often the row is renewed. Defaults to TTL/3.
	Interval time.Duration
	// Listener names the network the advertised address is for (Kafka's listener
	// name): Metadata served on a listener lists the brokers of that listener only.
	// Defaults to "PLAINTEXT".
	Listener string
	// Logger receives renewal failures. Defaults to slog.Default().
	Logger *slog.Logger
	// Rack is the rack Metadata reports for this broker. Defaults to none.
	Rack string
	// Slots is how many broker identities (rows, node ids) the instance registers at
	// its address, between 1 and MaxSlots. Defaults to 1.
	Slots int
	// TTL is how long a row outlives its last heartbeat: the longest a dead instance
	// stays listed. Defaults to 10s.
	TTL time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.TTL == 0 {
		out.TTL = 10 * time.Second
	}
	if out.TTL < 100*time.Millisecond || out.TTL > time.Hour {
		return out, fmt.Errorf("brokers: Config.TTL %v must be between 100ms and 1h", out.TTL)
	}
	if out.Interval == 0 {
		out.Interval = out.TTL / 3
	}
	if out.Interval <= 0 || out.Interval >= out.TTL {
		return out, fmt.Errorf("brokers: Config.Interval %v must be positive and below TTL %v", out.Interval, out.TTL)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Listener == "" {
		out.Listener = DefaultListener
	}
	if out.Slots == 0 {
		out.Slots = 1
	}
	if out.Slots < 1 || out.Slots > MaxSlots {
		return out, fmt.Errorf("brokers: Config.Slots %d must be between 1 and %d", out.Slots, MaxSlots)
	}
	return out, nil
}

// MaxSlots bounds Config.Slots: every client of a listener opens connections to
// every identity it is given a partition of.
const MaxSlots = 64

// DefaultListener is the listener name of Config's default.
const DefaultListener = "PLAINTEXT"

// Registration is this instance's row. Create it with Register; Run keeps it alive.
type Registration struct {
	pool     *pgxpool.Pool
	cfg      Config
	host     string
	port     int32
	instance string
	nodeIDs  atomic.Pointer[[]int32] // by slot
}

// Register writes this instance's rows for host:port (Config.Slots of them) and
// returns the registration, whose node ids are stable per address and slot. An empty
// host, a port outside 1..65535 or a bad Config is refused before anything is
// written.
func Register(ctx context.Context, pool *pgxpool.Pool, host string, port int32, cfg *Config) (*Registration, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if host == "" {
		return nil, errors.New("brokers: advertised host is empty")
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("brokers: advertised port %d must be between 1 and 65535", port)
	}
	r := &Registration{pool: pool, cfg: c, host: host, port: port, instance: uuid.NewString()}
	if err := r.heartbeat(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// NodeID is the broker id of this instance's slot 0.
func (r *Registration) NodeID() int32 { return (*r.nodeIDs.Load())[0] }

// NodeIDs are the broker ids of this instance, by slot.
func (r *Registration) NodeIDs() []int32 { return slices.Clone(*r.nodeIDs.Load()) }

// Self is this instance's slot 0 as a Broker.
func (r *Registration) Self() Broker { return r.Selves()[0] }

// Selves are this instance's identities as Brokers, by slot: the same address, one
// node id each.
func (r *Registration) Selves() []Broker {
	var rack *string
	if r.cfg.Rack != "" {
		rack = &r.cfg.Rack
	}
	ids := *r.nodeIDs.Load()
	out := make([]Broker, len(ids))
	for i, id := range ids {
		out[i] = Broker{NodeID: id, Host: r.host, Port: r.port, Rack: rack}
	}
	return out
}

func (r *Registration) heartbeat(ctx context.Context) error {
	var rack *string
	if r.cfg.Rack != "" {
		rack = &r.cfg.Rack
	}
	rows, err := r.pool.Query(ctx, "SELECT streamd.kafka_broker_heartbeat_slots($1, $2, $3, $4, $5, $6, $7)",
		r.cfg.Listener, r.host, r.port, r.instance, rack, int32(r.cfg.TTL/time.Millisecond), int32(r.cfg.Slots))
	if err != nil {
		return fmt.Errorf("broker heartbeat %s:%d: %w", r.host, r.port, sqlerr.Wrap(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("broker heartbeat %s:%d: %w", r.host, r.port, sqlerr.Wrap(err))
	}
	if len(ids) != r.cfg.Slots {
		return fmt.Errorf("broker heartbeat %s:%d: %d node ids for %d slots", r.host, r.port, len(ids), r.cfg.Slots)
	}
	r.nodeIDs.Store(&ids)
	return nil
}

// Run renews the rows every Interval until ctx ends, then deletes them (under a
// context of its own, bounded to 5s) so that Metadata stops listing this instance at
// once. It
// returns nil after ctx ends; a failed renewal is logged and retried at the next
// interval.
func (r *Registration) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := r.pool.Exec(dctx, "SELECT streamd.kafka_broker_deregister($1, $2)", r.NodeID(), r.instance); err != nil {
				r.cfg.Logger.Warn("kafka broker deregistration failed", "node_id", r.NodeID(), "err", err)
			}
			return nil
		case <-t.C:
			hctx, cancel := context.WithTimeout(ctx, r.cfg.Interval)
			err := r.heartbeat(hctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("kafka broker heartbeat failed", "node_id", r.NodeID(), "err", err)
			}
		}
	}
}

// Listener is the listener this registration is for.
func (r *Registration) Listener() string { return r.cfg.Listener }

// Live returns the brokers of listener whose rows have not expired, by node id.
func Live(ctx context.Context, pool *pgxpool.Pool, listener string) ([]Broker, error) {
	rows, err := pool.Query(ctx, `SELECT node_id, host, port, rack FROM streamd.kafka_brokers
		WHERE listener = $1 AND expires_at > clock_timestamp() ORDER BY node_id`, listener)
	if err != nil {
		return nil, fmt.Errorf("live brokers: %w", sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Broker, error) {
		var b Broker
		err := row.Scan(&b.NodeID, &b.Host, &b.Port, &b.Rack)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("live brokers: %w", err)
	}
	return out, nil
}

// ClusterID returns the cluster id Kafka clients see (made once, by the migration).
func ClusterID(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var id string
	if err := pool.QueryRow(ctx, "SELECT cluster_id FROM streamd.kafka_cluster").Scan(&id); err != nil {
		return "", fmt.Errorf("kafka cluster id: %w", sqlerr.Wrap(err))
	}
	return id, nil
}
