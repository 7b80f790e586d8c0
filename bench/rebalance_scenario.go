package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/consumergroup"
)

// rebalanceScenario measures group membership changes (issue 3) on an idle stream of
// 12 partitions, by polling streamd.consumer_group_status every 5 ms:
//
//   - join N→N+1 (N = 1, 2, 3): a group of N consumers has settled; one more starts.
//     Time from its Run call to a settled assignment: every partition owned, N+1
//     owners whose counts differ by at most one, no pending move. This includes the
//     new member's join and the revokes of the old owners (each commits and releases).
//   - kill: a group of 3 has settled with SessionTimeout 2 s; one member goes silent
//     without leaving: every TCP connection of its pool (and of its LISTEN
//     connection) is closed and no new one can be opened, which the server sees
//     exactly as a SIGKILLed process. Time from the cut to a settled assignment over
//     the 2 survivors, minus the session timeout: the detection overhead.
//
// Each consumer has its own pool, as separate worker processes would. Every case is
// repeated (3 times quick, 5 full, once tiny) and is a timing-only result: the
// distribution of the repetitions (p50, max), with the partitions that changed owner
// in its note.
type rebalanceScenario struct{}

func init() { register(60, rebalanceScenario{}) }

func (rebalanceScenario) Name() string { return "rebalance" }

const (
	rebalancePartitions = 12
	killSessionTimeout  = 2 * time.Second
)

func (s rebalanceScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	reps := bySuite(env, 1, 3, 5)
	stream := env.StreamName("rebalance")
	if err := env.Client.CreateStream(ctx, stream, rebalancePartitions); err != nil {
		return nil, err
	}
	defer func() { _ = dropStream(ctx, env, stream) }()
	var out []Result
	for n := 1; n <= 3; n++ {
		var times []time.Duration
		moved := 0
		for rep := 0; rep < reps; rep++ {
			d, m, err := s.join(ctx, env, stream, fmt.Sprintf("join%d-%d", n, rep), n)
			if err != nil {
				return nil, fmt.Errorf("rebalance join %d→%d: %w", n, n+1, err)
			}
			env.Logger.Info("rebalance join", "members", n+1, "rep", rep, "ms", d.Milliseconds(), "moved", m)
			times = append(times, d)
			moved += m
		}
		out = append(out, rebalanceResult(fmt.Sprintf("rebalance join %d→%d p=%d", n, n+1, rebalancePartitions), "join", n+1, times, moved,
			"from the new member's Run to every partition owned, counts within one, no pending move"))
	}
	var times []time.Duration
	moved := 0
	for rep := 0; rep < reps; rep++ {
		d, m, err := s.kill(ctx, env, stream, fmt.Sprintf("kill-%d", rep))
		if err != nil {
			return nil, fmt.Errorf("rebalance kill: %w", err)
		}
		env.Logger.Info("rebalance kill", "rep", rep, "ms_past_session_timeout", d.Milliseconds(), "moved", m)
		times = append(times, d)
		moved += m
	}
	out = append(out, rebalanceResult(fmt.Sprintf("rebalance kill 3→2 p=%d", rebalancePartitions), "kill", 2, times, moved,
		fmt.Sprintf("from cutting a member's connections to the survivors owning everything, minus its session timeout (%s)", killSessionTimeout)))
	return out, nil
}

func rebalanceResult(name, mode string, members int, times []time.Duration, moved int, note string) Result {
	op := "new member's Run to a settled assignment"
	if mode == "kill" {
		op = "connections cut to a settled assignment, minus the session timeout"
	}
	r := timingResult("rebalance", "streamd", name, false, Params{Partitions: rebalancePartitions, Conns: members, Mode: mode}, op, times)
	r.Note = fmt.Sprintf("%s; %d repetition(s), %d partition move(s) in all; no raw-PostgreSQL baseline", note, len(times), moved)
	return r
}

// groupMember is one consumer of a rebalance case, with its own pool.
type groupMember struct {
	pool   *pgxpool.Pool
	cut    *connCutter
	cancel context.CancelFunc
	done   chan error
}

// startMember starts a consumer of group on stream whose handler does nothing; tune,
// when given, adjusts its config.
func startMember(ctx context.Context, env *Env, stream, group, id string, session time.Duration, tune ...func(*consumergroup.Config)) (*groupMember, error) {
	cfg := env.Pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 4, 0
	cut := &connCutter{}
	cut.install(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ccfg := consumergroup.Config{Stream: stream, Group: group, ConsumerID: id, SessionTimeout: session, Logger: quietLogger}
	for _, f := range tune {
		f(&ccfg)
	}
	c, err := consumergroup.New(pool, &ccfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	m := &groupMember{pool: pool, cut: cut, cancel: cancel, done: make(chan error, 1)}
	go func() { // owner: the member; exits when stop cancels mctx
		m.done <- c.Run(mctx, func(context.Context, *consumergroup.Batch) error { return nil })
	}()
	return m, nil
}

// stop cancels the member, waits for Run (a clean leave unless its connections were
// cut) and closes its pool.
func (m *groupMember) stop() {
	m.cancel()
	<-m.done
	m.pool.Close()
}

// groupState is the group's assignment as consumer_group_status shows it.
type groupState struct {
	owners  map[string]int // partitions per owner
	unowned int
	pending int
}

func readGroupState(ctx context.Context, env *Env, stream, group string, partitions int) (groupState, error) {
	st := groupState{owners: map[string]int{}}
	rows, err := env.Pool.Query(ctx, `SELECT consumer_id, pending_owner IS NOT NULL FROM streamd.consumer_group_status
		WHERE stream_name = $1 AND group_id = $2 AND partition IS NOT NULL`, stream, group)
	if err != nil {
		return st, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var owner *string
		var pending bool
		if err := rows.Scan(&owner, &pending); err != nil {
			return st, err
		}
		n++
		if owner == nil {
			st.unowned++
		} else {
			st.owners[*owner]++
		}
		if pending {
			st.pending++
		}
	}
	st.unowned += partitions - n // partitions without a row yet
	return st, rows.Err()
}

// settled reports whether every partition is owned by exactly members owners, their
// counts within one, and no move pending; none of the owners may be in gone.
func (st groupState) settled(members int, gone map[string]bool) bool {
	if st.unowned > 0 || st.pending > 0 || len(st.owners) != members {
		return false
	}
	lo, hi := int(^uint(0)>>1), 0
	for o, k := range st.owners {
		if gone[o] {
			return false
		}
		lo, hi = min(lo, k), max(hi, k)
	}
	return hi-lo <= 1
}

// waitSettled polls the group's status until it is settled for members owners and
// returns the state then.
func waitSettled(ctx context.Context, env *Env, stream, group string, members int, gone map[string]bool, limit time.Duration) (groupState, error) {
	return waitSettledOn(ctx, env, stream, group, rebalancePartitions, members, gone, limit)
}

// waitSettledOn is waitSettled on a stream of partitions partitions.
func waitSettledOn(ctx context.Context, env *Env, stream, group string, partitions, members int, gone map[string]bool, limit time.Duration) (groupState, error) {
	deadline := time.Now().Add(limit)
	for {
		st, err := readGroupState(ctx, env, stream, group, partitions)
		if err != nil {
			return st, err
		}
		if st.settled(members, gone) {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("group %s not settled on %d members within %s: %+v", group, members, limit, st)
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
}

// ownership returns, per owner, the set of partitions it owns.
func ownership(ctx context.Context, env *Env, stream, group string) (map[int32]string, error) {
	rows, err := env.Pool.Query(ctx, `SELECT partition, coalesce(consumer_id, '') FROM streamd.consumer_group_status
		WHERE stream_name = $1 AND group_id = $2 AND partition IS NOT NULL`, stream, group)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int32]string{}
	for rows.Next() {
		var p int32
		var o string
		if err := rows.Scan(&p, &o); err != nil {
			return nil, err
		}
		out[p] = o
	}
	return out, rows.Err()
}

func movedBetween(a, b map[int32]string) int {
	n := 0
	for p, o := range b {
		if a[p] != o {
			n++
		}
	}
	return n
}

// join settles a group of n members, starts one more, and returns the time to a
// settled assignment over n+1 and the partitions that moved.
func (rebalanceScenario) join(ctx context.Context, env *Env, stream, label string, n int) (time.Duration, int, error) {
	group := "bench-" + label + "-" + env.RunID
	var members []*groupMember
	defer func() {
		for _, m := range members {
			m.stop()
		}
	}()
	for i := 0; i < n; i++ {
		m, err := startMember(ctx, env, stream, group, fmt.Sprintf("m%d", i), 10*time.Second)
		if err != nil {
			return 0, 0, err
		}
		members = append(members, m)
	}
	if _, err := waitSettled(ctx, env, stream, group, n, nil, 60*time.Second); err != nil {
		return 0, 0, err
	}
	before, err := ownership(ctx, env, stream, group)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	m, err := startMember(ctx, env, stream, group, fmt.Sprintf("m%d", n), 10*time.Second)
	if err != nil {
		return 0, 0, err
	}
	members = append(members, m)
	if _, err := waitSettled(ctx, env, stream, group, n+1, nil, 60*time.Second); err != nil {
		return 0, 0, err
	}
	d := time.Since(t0)
	after, err := ownership(ctx, env, stream, group)
	if err != nil {
		return 0, 0, err
	}
	return d, movedBetween(before, after), nil
}

// kill settles a group of 3 members with a short session timeout, cuts one member's
// connections and returns the time to a settled assignment over the other two, minus
// the session timeout, and the partitions that moved.
func (rebalanceScenario) kill(ctx context.Context, env *Env, stream, label string) (time.Duration, int, error) {
	group := "bench-" + label + "-" + env.RunID
	var members []*groupMember
	defer func() {
		for _, m := range members {
			m.stop()
		}
	}()
	for i := 0; i < 3; i++ {
		m, err := startMember(ctx, env, stream, group, fmt.Sprintf("m%d", i), killSessionTimeout)
		if err != nil {
			return 0, 0, err
		}
		members = append(members, m)
	}
	if _, err := waitSettled(ctx, env, stream, group, 3, nil, 60*time.Second); err != nil {
		return 0, 0, err
	}
	before, err := ownership(ctx, env, stream, group)
	if err != nil {
		return 0, 0, err
	}
	// The victim's member id: an owner id starts with the ConsumerID prefix "m0".
	gone := map[string]bool{}
	for _, o := range before {
		if len(o) >= 2 && o[:2] == "m0" {
			gone[o] = true
		}
	}
	if len(gone) == 0 {
		return 0, 0, errors.New("member m0 owns nothing in a settled group of 3")
	}
	t0 := time.Now()
	members[0].cut.cut()
	if _, err := waitSettled(ctx, env, stream, group, 2, gone, 60*time.Second); err != nil {
		return 0, 0, err
	}
	d := time.Since(t0) - killSessionTimeout
	after, err := ownership(ctx, env, stream, group)
	if err != nil {
		return 0, 0, err
	}
	return d, movedBetween(before, after), nil
}

// connCutter tracks every connection a pool (and the consumer's LISTEN connection,
// which copies the pool's ConnConfig) dials; cut closes them all and makes every later
// dial fail, so the member can neither heartbeat nor leave.
type connCutter struct {
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (c *connCutter) install(cfg *pgxpool.Config) {
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.mu.Lock()
		dead := c.dead
		c.mu.Unlock()
		if dead {
			return nil, errors.New("bench: member killed")
		}
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.dead {
			conn.Close()
			return nil, errors.New("bench: member killed")
		}
		c.conns = append(c.conns, conn)
		return conn, nil
	}
}

func (c *connCutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = true
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}
