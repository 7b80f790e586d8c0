package eventstore_test

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/streamd/streamd/internal/sqlerr"
)

// wrap maps a raw pgx error from a plain SQL statement to the package's sentinels.
func wrap(err error) error { return sqlerr.Wrap(err) }

func asPg(err error, target **pgconn.PgError) bool { return errors.As(err, target) }
