package eventstore_test

import "github.com/streamd/streamd/internal/sqlerr"

// wrap maps a raw pgx error from a plain SQL statement to the package's sentinels.
func wrap(err error) error { return sqlerr.Wrap(err) }
