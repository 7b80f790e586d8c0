// Package sqlerr maps the SQLSTATEs that streamd's SQL functions raise to the Go
// sentinels of the public packages. It is the one place where codes become errors:
// codes.go lists every code and its sentinel, in one table (no registration at init,
// so the mapping does not depend on which packages a program imports).
package sqlerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error is a database error that streamd's SQL raised on purpose. It matches its
// sentinel with errors.Is and the underlying *pgconn.PgError with errors.As.
type Error struct {
	// Sentinel is the condition, e.g. streams.ErrStreamNotFound.
	Sentinel error
	// PgErr is the error PostgreSQL returned; its Message says what was wrong.
	PgErr *pgconn.PgError
}

func (e *Error) Error() string {
	return fmt.Sprintf("%v: %s", e.Sentinel, e.PgErr.Message)
}

// Unwrap returns the sentinel and the PostgreSQL error.
func (e *Error) Unwrap() []error { return []error{e.Sentinel, e.PgErr} }

// Wrap returns err as an *Error when it is a PostgreSQL error with a code of the
// table in codes.go, and err unchanged otherwise (nil stays nil).
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	sentinel, ok := sentinels[pgErr.Code]
	if !ok {
		return err
	}
	return &Error{Sentinel: sentinel, PgErr: pgErr}
}

// Code returns the SQLSTATE of err, or "" when err is not a PostgreSQL error.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Retriable reports whether an operation that failed with err may be retried: the
// connection broke, the server is shutting down or restarting, the transaction was a
// serialization or deadlock victim, a lock_timeout or statement_timeout the database
// sets ran out, or no connection could be had. Callers that retry
// writes must make them idempotent (event ids, lease tokens, epochs).
func Retriable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01": // serialization failure, deadlock
			return true
		case pgErr.Code == "53300", pgErr.Code == "53400": // too many connections
			return true
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08": // connection exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdown, crash, cannot connect now
			return true
		case pgErr.Code == "55P03": // lock_not_available: a lock_timeout the role or database sets
			return true
		case pgErr.Code == "57014" && strings.Contains(pgErr.Message, "statement timeout"):
			// A statement_timeout, not a cancel the caller asked for (same code).
			return true
		}
		return false
	}
	if errors.Is(err, errors.ErrUnsupported) {
		return false
	}
	// Not a server error: a network error, a closed connection, a dial failure.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	return isConnectionFailure(err)
}
