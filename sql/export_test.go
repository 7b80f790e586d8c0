package schema

import (
	"context"
	"io/fs"

	"github.com/jackc/pgx/v5"
)

// Files are the embedded files, for tests that change one.
var Files fs.FS = files

// MigrateFS is Migrate with the files of fsys.
func MigrateFS(ctx context.Context, conn *pgx.Conn, fsys fs.FS) (Result, error) {
	return migrateConn(ctx, conn, fsys)
}
