package eventstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// OpenOpts are per-call knobs of Open. A nil *OpenOpts means the Store's defaults.
type OpenOpts struct {
	// OpenTimeout is how long to wait for a key another session holds. Defaults to
	// Config.OpenTimeout.
	OpenTimeout time.Duration
	// SessionID names the session; opening with the id of a live session renews it.
	// Defaults to a random id.
	SessionID string
	// SessionTimeout is how long the session holds the key after Open or Renew.
	// Defaults to Config.SessionTimeout.
	SessionTimeout time.Duration
}

// Session is an exclusive writer session on one key (seed 004): while it is live, no
// other session can open the key and appends outside it fail with ErrSessionHeld.
// Every operation of the session checks, in SQL and under the key's row lock, that
// the session still holds the key: ErrSessionExpired after its timeout passed (and
// nobody wrote or took the key since); ErrSessionHeld once another session took the
// expired key over and still holds it; ErrNotOpen when nobody holds the key any more
// (released behind the session's back, a takeover that has ended since, or an append
// outside any session after the session expired, which ends its hold).
//
// A Session is safe for concurrent use; Close is idempotent.
type Session struct {
	store   *Store
	stream  string
	key     string
	id      string
	timeout time.Duration

	mu       sync.Mutex
	expires  time.Time
	closed   bool // Close was called: no more appends
	released bool // Close released the key in the database
}

// Open opens key of stream for exclusive writing. When another live session holds the
// key, it retries until the open timeout and then fails with ErrOpenTimeout; an
// append in flight on the key (AppendTx in a transaction not yet committed) is waited
// for, but no longer than the open timeout either. Errors also: ErrNotVersioned
// (sessions need key versions), streams.ErrStreamNotFound, streams.ErrInvalidArgument
// (empty key, negative timeouts).
func (s *Store) Open(ctx context.Context, stream, key string, opts *OpenOpts) (*Session, error) {
	sess, err := s.openSession(ctx, stream, key, opts)
	s.metrics.open(err)
	return sess, err
}

func (s *Store) openSession(ctx context.Context, stream, key string, opts *OpenOpts) (*Session, error) {
	var o OpenOpts
	if opts != nil {
		o = *opts
	}
	if o.OpenTimeout < 0 || o.SessionTimeout < 0 {
		return nil, fmt.Errorf("open %s/%s: %w: OpenOpts.OpenTimeout and OpenOpts.SessionTimeout must not be negative", stream, key, streams.ErrInvalidArgument)
	}
	if o.OpenTimeout == 0 {
		o.OpenTimeout = s.cfg.OpenTimeout
	}
	if o.SessionTimeout == 0 {
		o.SessionTimeout = s.cfg.SessionTimeout
	}
	if o.SessionID == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		o.SessionID = hex.EncodeToString(b)
	}
	sess := &Session{store: s, stream: stream, key: key, id: o.SessionID, timeout: o.SessionTimeout}
	deadline := time.Now().Add(o.OpenTimeout)
	bo := backoff.New(5*time.Millisecond, 200*time.Millisecond)
	for {
		err := sess.open(ctx, time.Until(deadline))
		if err == nil {
			return sess, nil
		}
		if !isHeld(err) && sqlerr.Code(err) != sqlerr.LockNotAvailable {
			return nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("open %s/%s within %s: %w (%w)", stream, key, o.OpenTimeout, ErrOpenTimeout, err)
		}
		if !backoff.Sleep(ctx, min(bo.Next(), left)) {
			return nil, fmt.Errorf("open %s/%s: %w", stream, key, ctx.Err())
		}
	}
}

// open takes the key for the session, waiting at most wait (at least 1 ms) for an
// append in flight on the key: the key head's row lock is otherwise waited for
// without bound, past the open timeout. A lock wait cut short is 55P03
// (lock_not_available), which openSession retries like a held key.
func (sess *Session) open(ctx context.Context, wait time.Duration) error {
	var exp time.Time
	err := sess.store.pool.QueryRow(ctx, "SELECT streamd.open_key_session($1, $2, $3, $4, $5, $6)",
		sess.stream, sess.key, sess.id, sess.timeout, sess.store.now(), max(wait, time.Millisecond)).Scan(&exp)
	return sess.held(err, "open", exp)
}

// held keeps the expiry that open_key_session or renew_key_session returned.
func (sess *Session) held(err error, verb string, exp time.Time) error {
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", verb, sess.stream, sess.key, sqlerr.Wrap(err))
	}
	sess.mu.Lock()
	sess.expires = exp
	sess.mu.Unlock()
	return nil
}

// ID returns the session's id.
func (sess *Session) ID() string { return sess.id }

// ExpiresAt returns when the session expires, as of its last Open or Renew.
func (sess *Session) ExpiresAt() time.Time {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.expires
}

func (sess *Session) check() error {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.closed {
		return fmt.Errorf("session %s on %s/%s: %w", sess.id, sess.stream, sess.key, ErrSessionClosed)
	}
	return nil
}

// Renew extends the session by its timeout from now. A session that expired is
// renewed if nobody wrote or took the key since; otherwise it lost its exclusive hold
// in between, and Renew fails: with ErrSessionHeld when another live session took the
// key over, with ErrNotOpen when nobody holds it (the session was released behind its
// back, the session that took the key over has closed or expired since, or an append
// outside any session wrote the key after this session expired).
func (sess *Session) Renew(ctx context.Context) error {
	if err := sess.check(); err != nil {
		return err
	}
	var exp time.Time
	err := sess.store.pool.QueryRow(ctx, "SELECT streamd.renew_key_session($1, $2, $3, $4, $5)",
		sess.stream, sess.key, sess.id, sess.timeout, sess.store.now()).Scan(&exp)
	return sess.held(err, "renew", exp)
}

// Append appends events to the session's key, as Store.Append does, after checking
// in the same statement that the session holds the key and has not expired.
func (sess *Session) Append(ctx context.Context, expected ExpectedVersion, events ...Event) (*AppendResult, error) {
	if err := sess.check(); err != nil {
		return nil, err
	}
	return sess.store.appendTo(ctx, sess.store.pool, sess.stream, sess.key, expected, sess.id, events)
}

// AppendTx is Append inside the caller's transaction.
func (sess *Session) AppendTx(ctx context.Context, tx streams.DBTX, expected ExpectedVersion, events ...Event) (*AppendResult, error) {
	if err := sess.check(); err != nil {
		return nil, err
	}
	return sess.store.appendTo(ctx, tx, sess.stream, sess.key, expected, sess.id, events)
}

// SaveSnapshot stores the key's state at version, checking the session as Append does.
func (sess *Session) SaveSnapshot(ctx context.Context, version int64, snap SnapshotData) error {
	if err := sess.check(); err != nil {
		return err
	}
	return sess.store.saveSnapshot(ctx, sess.stream, sess.key, version, snap, sess.id)
}

// Close releases the key at once. Closing a session that no longer holds the key
// (see Renew) is not an error; closing again after a Close that
// succeeded is a no-op. The release runs even when ctx has ended (a deferred Close
// with the request's cancelled ctx), bounded by 10 s; when it fails, the session
// takes no more appends and Close may be called again to retry the release (else
// the key is held until the session expires).
func (sess *Session) Close(ctx context.Context) error {
	sess.mu.Lock()
	if sess.released {
		sess.mu.Unlock()
		return nil
	}
	sess.closed = true
	sess.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := sess.store.pool.Exec(rctx, "SELECT streamd.close_key_session($1, $2, $3)", sess.stream, sess.key, sess.id)
	if err != nil {
		return fmt.Errorf("close session on %s/%s: %w", sess.stream, sess.key, sqlerr.Wrap(err))
	}
	sess.mu.Lock()
	sess.released = true
	sess.mu.Unlock()
	return nil
}
