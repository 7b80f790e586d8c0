// Package tailer reads committed inserts into streamd.events and
// streamd.queue_messages (the queues' storage; streamd.messages is its view) from
// PostgreSQL's logical replication stream (pgoutput, publication streamd_wakeups)
// and hands each committed transaction's (stream, partition) and
// queue names to a handler, which turns them into wake-ups.
//
// Wake-ups are hints. Readers always read through SQL by offset range, so ordering
// never depends on the tailer, and polling stays on as the safety net.
//
// One goroutine (the caller of Run) owns the replication connection: it reads, decodes,
// calls the handler, and sends standby status updates on a deadline, confirming only
// positions whose transactions the handler has returned for. The slot is TEMPORARY:
// the server drops it when the connection ends, however the process dies, so nothing
// pins WAL after it. Commits made while the tailer is not streaming are not replayed;
// instead each (re)start hands the handler an Event with All set.
package tailer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
)

// State is what the tailer is doing.
type State int32

const (
	// StateConnecting: not streaming yet, or reconnecting after a failure.
	StateConnecting State = iota
	// StateStreaming: reading from its slot; wake-ups flow.
	StateStreaming
	// StateUnsupported: the tailer cannot run here (see the fallback reasons); it
	// retries every Config.UnsupportedRetry, and polling is the only path meanwhile.
	StateUnsupported
)

// String returns the state's name, for logs.
func (s State) String() string {
	switch s {
	case StateConnecting:
		return "connecting"
	case StateStreaming:
		return "streaming"
	case StateUnsupported:
		return "unsupported"
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// Tailer is a logical replication reader. Create it with New; Run may be called again
// after it returned, never concurrently.
type Tailer struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	state   atomic.Int32
	streams atomic.Int64 // sessions that reached streaming, for tests and logs
}

// New checks cfg and returns a Tailer. It does not connect.
func New(cfg *Config) (*Tailer, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	return &Tailer{cfg: c, log: c.Logger, m: m}, nil
}

// State returns what the tailer is doing now. Safe to call from any goroutine.
func (t *Tailer) State() State { return State(t.state.Load()) }

// Sessions returns how many times the tailer has started streaming.
func (t *Tailer) Sessions() int64 { return t.streams.Load() }

// unsupportedError says the tailer cannot run here, and why (a fallback reason).
type unsupportedError struct {
	reason string
	err    error
}

func (e *unsupportedError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *unsupportedError) Unwrap() error { return e.err }

// Run streams until ctx ends, reconnecting with backoff after every failure, and
// returns nil then. It returns an error only for a bad connection string.
func (t *Tailer) Run(ctx context.Context) error {
	// Parsed as a pool's string so that pool_* settings are accepted and dropped.
	poolCfg, err := pgxpool.ParseConfig(t.cfg.ConnString)
	if err != nil {
		return fmt.Errorf("tailer: parse Config.ConnString: %w", err)
	}
	plainCfg := poolCfg.ConnConfig.Config.Copy()
	connCfg := poolCfg.ConnConfig.Config.Copy()
	connCfg.RuntimeParams["replication"] = "database"
	connCfg.RuntimeParams["application_name"] = t.cfg.ApplicationName
	t.log.Info("tailer started", "publication", t.cfg.Publication)
	defer t.log.Info("tailer stopped")
	// A tailer that stopped (its instance no longer leads) reports no fallback and no
	// lag: its last values would skew sums over instances forever.
	defer func() {
		t.m.setFallback("")
		t.m.lagBytes.Set(0)
	}()

	bo := backoff.NewJittered(t.cfg.MinBackoff, t.cfg.MaxBackoff)
	lastReason := ""
	for ctx.Err() == nil {
		err := t.session(ctx, connCfg, plainCfg)
		t.m.connected.Set(0)
		if ctx.Err() != nil {
			break
		}
		var wait time.Duration
		var unsup *unsupportedError
		if errors.As(err, &unsup) {
			t.state.Store(int32(StateUnsupported))
			t.m.setFallback(unsup.reason)
			if unsup.reason != lastReason {
				// Said once per change of cause, not per retry.
				t.log.Warn("tailer cannot run; wake-ups come from polling only",
					"reason", unsup.reason, "error", unsup.err)
				lastReason = unsup.reason
				t.cfg.Advisories.Publish(advisory.Advisory{Type: advisory.TypeTailerPolling, Key: t.cfg.ApplicationName,
					Data: advisory.Tailer{Tailer: t.cfg.ApplicationName, Reason: unsup.reason, Error: unsup.err.Error(), At: time.Now()}})
			}
			wait = t.cfg.UnsupportedRetry
		} else {
			lastReason = ""
			t.m.setFallback("")
			t.state.Store(int32(StateConnecting))
			t.m.reconnects.Inc()
			if errors.Is(err, errStreamedThenLost) {
				// It worked until now: try again soon, from the first step.
				bo.Reset()
				t.cfg.Advisories.Publish(advisory.Advisory{Type: advisory.TypeTailerSlotLost, Key: t.cfg.ApplicationName,
					Data: advisory.Tailer{Tailer: t.cfg.ApplicationName, Error: err.Error(), At: time.Now()}})
			}
			wait = bo.Next()
			t.log.Debug("tailer reconnecting", "error", err, "backoff", wait)
		}
		backoff.Sleep(ctx, wait)
	}
	t.state.Store(int32(StateConnecting))
	return nil
}

// errStreamedThenLost marks a session that streamed before it failed: reconnect at
// once, with the backoff reset.
var errStreamedThenLost = errors.New("tailer: replication connection lost")

// session opens one replication connection, creates a temporary slot, and streams
// until an error or ctx ends.
func (t *Tailer) session(ctx context.Context, connCfg, plainCfg *pgconn.Config) (err error) {
	conn, err := pgconn.ConnectConfig(ctx, connCfg)
	if err != nil {
		if code := pgCode(err); code == "42501" || code == "28000" {
			// "must be superuser or replication role", or no pg_hba entry for
			// replication connections.
			return &unsupportedError{reason: ReasonPrivilege, err: err}
		}
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		// The server drops the temporary slot when the connection ends.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()

	if err := t.check(ctx, conn); err != nil {
		return err
	}
	slot := "streamd_tailer_" + randomHex(8)
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Temporary:      true,
		SnapshotAction: "NOEXPORT_SNAPSHOT",
		Mode:           pglogrepl.LogicalReplication,
	})
	if err != nil {
		if code := pgCode(err); code == "42501" {
			return &unsupportedError{reason: ReasonPrivilege, err: err}
		} else if code == "55000" {
			return &unsupportedError{reason: ReasonWalLevel, err: err}
		}
		return fmt.Errorf("create replication slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return fmt.Errorf("slot consistent point %q: %w", res.ConsistentPoint, err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, start, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + escapeLiteral(t.cfg.Publication) + "'",
		},
	})
	if err != nil {
		return fmt.Errorf("start replication: %w", err)
	}

	// Anything committed before the slot existed was not seen by this session. The
	// handler hears so before the session shows as streaming: whoever sees
	// StateStreaming (or Sessions go up) knows the wake-up for everything was
	// already handed on.
	t.cfg.Handler(ctx, Event{All: true})
	t.state.Store(int32(StateStreaming))
	t.streams.Add(1)
	t.m.connected.Set(1)
	t.m.setFallback("")
	t.log.Debug("tailer streaming", "slot", slot, "start_lsn", start)

	// The lag gauge is sampled by a goroutine of its own, off the stream loop: its
	// query (and its connection's setup, up to a second each) must never delay a
	// wake-up.
	var handled atomic.Uint64
	handled.Store(uint64(start))
	lagCtx, stopLag := context.WithCancel(ctx)
	lagDone := make(chan struct{})
	go func() { // owner: session; ends when the session does (stopLag)
		defer close(lagDone)
		t.sampleLag(lagCtx, plainCfg, &handled)
	}()
	defer func() { stopLag(); <-lagDone }()
	err = t.stream(ctx, conn, start, &handled)
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("%w: %w", errStreamedThenLost, err)
}

// check fails with an *unsupportedError when the tailer cannot run on this server,
// creating the publication first when it is missing and the role may.
func (t *Tailer) check(ctx context.Context, conn *pgconn.PgConn) error {
	rs, err := conn.Exec(ctx, "SELECT current_setting('wal_level'), EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = '"+
		escapeLiteral(t.cfg.Publication)+"')").ReadAll()
	if err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 || len(rs[0].Rows[0]) != 2 {
		return errors.New("read wal_level: unexpected result")
	}
	if lvl := string(rs[0].Rows[0][0]); lvl != "logical" {
		return &unsupportedError{reason: ReasonWalLevel, err: fmt.Errorf("wal_level is %s, not logical", lvl)}
	}
	if string(rs[0].Rows[0][1]) == "t" {
		return nil
	}
	if t.cfg.Publication != DefaultPublication {
		return &unsupportedError{reason: ReasonPublication, err: fmt.Errorf("publication %s does not exist", t.cfg.Publication)}
	}
	rs, err = conn.Exec(ctx, "SELECT streamd.wakeup_publication_ensure()").ReadAll()
	if err != nil {
		// A passing error (a lock or statement timeout behind another transaction, a
		// serialization failure) is tried again soon like a lost connection; it used
		// to count as "publication unsupported", retried only after UnsupportedRetry.
		if pgCode(err) != "" && !sqlerr.Retriable(err) {
			return &unsupportedError{reason: ReasonPublication, err: fmt.Errorf("create publication: %w", err)}
		}
		return fmt.Errorf("create publication: %w", err)
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "t" {
		return &unsupportedError{reason: ReasonPublication, err: errors.New("publication streamd_wakeups is missing and this role may not create it")}
	}
	return nil
}

// stream reads the replication stream until an error or ctx ends. handled is the
// end of the last transaction the handler returned for (or a position with nothing
// of ours before it); it is the only position ever confirmed, and is published in
// shared for the lag gauge.
func (t *Tailer) stream(ctx context.Context, conn *pgconn.PgConn, handled pglogrepl.LSN, shared *atomic.Uint64) error {
	dec := newDecoder()
	nextStatus := time.Now().Add(t.cfg.StatusInterval)
	for {
		if !time.Now().Before(nextStatus) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: handled}); err != nil {
				return fmt.Errorf("send standby status: %w", err)
			}
			nextStatus = time.Now().Add(t.cfg.StatusInterval)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && pgconn.Timeout(err) {
				continue // time for a status update
			}
			return fmt.Errorf("receive: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				// Every message before the keepalive has been sent and handled, so
				// outside a transaction its position holds nothing left to handle;
				// confirming it lets the slot release WAL of other tables.
				if !dec.inTx && ka.ServerWALEnd > handled {
					handled = ka.ServerWALEnd
					shared.Store(uint64(handled)) // for the lag gauge (sampleLag)
				}
				if ka.ReplyRequested {
					nextStatus = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse xlog data: %w", err)
				}
				c, err := dec.decode(xld.WALData)
				if err != nil {
					return err
				}
				if c == nil {
					continue
				}
				if len(c.targets) > 0 {
					t.cfg.Handler(ctx, Event{Targets: c.targets, CommitTime: c.time, EndLSN: uint64(c.endLSN)})
					t.m.transactions.Inc()
					t.m.delay.Observe(time.Since(c.time).Seconds())
				}
				if c.endLSN > handled {
					handled = c.endLSN
					shared.Store(uint64(handled))
				}
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyDone:
			return errors.New("server ended the replication stream")
		}
	}
}

// sampleLag sets the lag gauge every status interval until ctx ends: the server's WAL
// end less handled (the stream loop's position, published at its status updates).
func (t *Tailer) sampleLag(ctx context.Context, cfg *pgconn.Config, handled *atomic.Uint64) {
	lag := &walLag{cfg: cfg}
	defer lag.close()
	tick := time.NewTicker(t.cfg.StatusInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if end, err := lag.walEnd(ctx); err == nil {
			t.m.lagBytes.Set(float64(lsnSub(end, pglogrepl.LSN(handled.Load()))))
		} else if ctx.Err() == nil {
			t.log.Debug("tailer: reading the WAL end for the lag gauge failed", "error", err)
		}
	}
}

// walLag reads the server's WAL end (pg_current_wal_lsn) on a plain connection of its
// own, opened on first use: the replication stream does not carry it (a logical
// walsender's messages hold the position of what it sent), so a lag computed from
// them stayed near 0 however far behind the tailer was.
type walLag struct {
	cfg  *pgconn.Config
	conn *pgconn.PgConn
}

func (l *walLag) walEnd(ctx context.Context) (pglogrepl.LSN, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if l.conn == nil {
		conn, err := pgconn.ConnectConfig(ctx, l.cfg)
		if err != nil {
			return 0, err
		}
		l.conn = conn
	}
	rs, err := l.conn.Exec(ctx, "SELECT pg_current_wal_lsn()").ReadAll()
	if err == nil && (len(rs) != 1 || len(rs[0].Rows) != 1) {
		err = errors.New("pg_current_wal_lsn returned no row")
	}
	if err != nil {
		l.close()
		return 0, err
	}
	return pglogrepl.ParseLSN(string(rs[0].Rows[0][0]))
}

func (l *walLag) close() {
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = l.conn.Close(ctx)
		cancel()
		l.conn = nil
	}
}

func lsnSub(a, b pglogrepl.LSN) uint64 {
	if a <= b {
		return 0
	}
	return uint64(a - b)
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func escapeLiteral(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
