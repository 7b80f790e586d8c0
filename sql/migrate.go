package schema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql functions/*.sql views/*.sql
var files embed.FS

// advisoryLockKey serialises migrations across processes ("streamd!" as an int64).
const advisoryLockKey int64 = 0x73747265616d6421

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Result says what a Migrate call did.
type Result struct {
	// Applied lists the versions of the migrations this call applied.
	Applied []int
	// ObjectsUpdated is true when functions or views were (re)created.
	ObjectsUpdated bool
	// NewerSchema is true when the database has migrations this binary does not know
	// (a newer streamd migrated it): the functions and views are then left as that
	// newer binary made them, not put back to this binary's older text.
	NewerSchema bool
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) { return migrationsIn(files) }

func migrationsIn(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, err
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("schema: migration file %s: name must start with a positive version number and '_'", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("schema: migrations %s and %s share version %d", prev, name, v)
		}
		seen[v] = name
		b, err := fs.ReadFile(fsys, path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// objectFile is one file of the re-applied layer: its path under sql/ and its text.
type objectFile struct {
	path, text string
}

// objects returns the function files then the view files, each in name order, and a
// hash of all of them.
func objects(fsys fs.FS) ([]objectFile, string, error) {
	var texts []objectFile
	h := sha256.New()
	for _, dir := range []string{"functions", "views"} {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return nil, "", err
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".sql") {
				continue
			}
			b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
			if err != nil {
				return nil, "", err
			}
			texts = append(texts, objectFile{path: dir + "/" + e.Name(), text: string(b)})
			h.Write([]byte(dir + "/" + e.Name() + "\n"))
			h.Write(b)
		}
	}
	return texts, hex.EncodeToString(h.Sum(nil)), nil
}

// Migrate brings the database's streamd schema up to date. It is idempotent and safe
// to run concurrently from several processes.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (Result, error) {
	var res Result
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate: acquire connection: %w", err)
	}
	defer conn.Release()
	return migrateConn(ctx, conn.Conn(), files)
}

// MigrateConn is Migrate on a single connection.
func MigrateConn(ctx context.Context, conn *pgx.Conn) (Result, error) {
	return migrateConn(ctx, conn, files)
}

// migrateConn migrates with the files of fsys (the embedded ones but in tests).
func migrateConn(ctx context.Context, conn *pgx.Conn, fsys fs.FS) (res Result, err error) {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", advisoryLockKey); err != nil {
		return res, fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	defer func() {
		// Unlock even when ctx was cancelled; a broken connection drops the lock anyway.
		_, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", advisoryLockKey)
		if err == nil && uerr != nil {
			err = fmt.Errorf("migrate: release advisory lock: %w", uerr)
		}
	}()

	// CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
	// exists: a role that owns a schema a DBA made for it (all docs/operations.md
	// asks) may lack it.
	var haveSchema bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'streamd')").Scan(&haveSchema); err != nil {
		return res, fmt.Errorf("migrate: look for the schema: %w", err)
	}
	if !haveSchema {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS streamd"); err != nil {
			return res, fmt.Errorf("migrate: create schema: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS streamd.schema_migrations (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		);
		CREATE TABLE IF NOT EXISTS streamd.schema_objects (
			id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
			hash       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		);`); err != nil {
		return res, fmt.Errorf("migrate: create bookkeeping tables: %w", err)
	}

	migrations, err := migrationsIn(fsys)
	if err != nil {
		return res, err
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM streamd.schema_migrations")
	if err != nil {
		return res, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return res, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	known := map[int]bool{}
	for _, m := range migrations {
		known[m.Version] = true
	}
	for _, v := range versions {
		applied[v] = true
		if !known[v] {
			res.NewerSchema = true
		}
	}

	texts, hash, err := objects(fsys)
	if err != nil {
		return res, err
	}
	var current string
	err = conn.QueryRow(ctx, "SELECT hash FROM streamd.schema_objects").Scan(&current)
	if err != nil && err != pgx.ErrNoRows {
		return res, fmt.Errorf("migrate: read object hash: %w", err)
	}

	// The pending migrations and the functions and views that go with them commit in
	// one transaction: running servers see the old tables with the old functions, or
	// the new with the new, never new tables under old function bodies (a migration
	// that replaced a constraint made the old queue_send fail until the functions
	// caught up), and a failure leaves nothing half applied.
	var applying []Migration
	for _, m := range migrations {
		if !applied[m.Version] {
			applying = append(applying, m)
		}
	}
	if len(applying) > 0 {
		current = "" // a migration may drop objects: re-create them all
	}
	updateObjects := current != hash && !res.NewerSchema
	if len(applying) == 0 && !updateObjects {
		return res, nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, m := range applying {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("apply migrations/%s.sql: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO streamd.schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return fmt.Errorf("apply %s: %w", m.Name, err)
			}
		}
		if !updateObjects {
			return nil
		}
		// Function bodies refer to each other in any order; check them when called.
		if _, err := tx.Exec(ctx, "SET LOCAL check_function_bodies = off"); err != nil {
			return err
		}
		for _, t := range texts {
			if _, err := tx.Exec(ctx, t.text); err != nil {
				return fmt.Errorf("apply %s: %w", t.path, err)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO streamd.schema_objects (hash) VALUES ($1)
			ON CONFLICT (id) DO UPDATE SET hash = EXCLUDED.hash, applied_at = now()`, hash)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	for _, m := range applying {
		res.Applied = append(res.Applied, m.Version)
	}
	res.ObjectsUpdated = updateObjects
	return res, nil
}
