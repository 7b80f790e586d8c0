// Package localpg starts and reuses a private PostgreSQL cluster for development,
// tests and benchmarks, so that `make run` and `make test` work on a machine that has
// only the PostgreSQL server binaries.
//
// The cluster lives in a state folder (by default one per user, the same from every
// working directory, or $STREAMD_STATE_DIR: see DefaultStateDir), listens on its own
// port (default 54329, $STREAMD_PG_PORT) and
// socket, runs with wal_level=logical, and is reused by every later run until Stop.
// One implementation serves `streamd serve`, the tests and the benchmarks.
//
// Concurrency: Ensure may be called from several processes at once (go test runs
// package binaries in parallel); they serialise on an flock in the state folder.
package localpg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnvDatabaseURL names the environment variable that, when set, replaces the local
// cluster with an existing database.
const EnvDatabaseURL = "STREAMD_DATABASE_URL"

// DefaultPort is the port of the local cluster unless $STREAMD_PG_PORT says otherwise.
const DefaultPort = 54329

// DefaultDatabase is the database created in the local cluster for streamd.
const DefaultDatabase = "streamd"

// ErrMissingBinaries is returned when the PostgreSQL server binaries cannot be found
// and cannot be installed.
var ErrMissingBinaries = errors.New("localpg: PostgreSQL server binaries not found")

// Config says where the local cluster lives. The zero value uses the defaults.
type Config struct {
	// BinDir is the folder of initdb, pg_ctl and postgres. Defaults to the one found on
	// PATH or the newest /usr/lib/postgresql/*/bin (installing Debian's postgresql
	// package when none is found and apt-get is usable). When set, nothing is installed.
	BinDir string
	// Logger receives lifecycle messages. Defaults to slog.Default().
	Logger *slog.Logger
	// Port is the TCP port. Defaults to $STREAMD_PG_PORT, else DefaultPort.
	Port int
	// Settings are extra postgresql.conf settings (name to value, written verbatim
	// after streamd's own, so they override them), e.g. {"wal_level": "replica"} for
	// a test of the fallback without logical decoding. Defaults to none.
	Settings map[string]string
	// StateDir is the folder that holds the data directory, the log and the lock.
	// Defaults to DefaultStateDir(): $STREAMD_STATE_DIR, else one folder per user,
	// whatever the working directory.
	StateDir string
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Port == 0 {
		out.Port = DefaultPort
		if v := os.Getenv(EnvPort); v != "" {
			p, err := strconv.Atoi(v)
			if err != nil || p <= 0 || p > 65535 {
				return out, fmt.Errorf("localpg: STREAMD_PG_PORT=%q is not a port number", v)
			}
			out.Port = p
		}
	}
	if out.StateDir == "" {
		out.StateDir = DefaultStateDir()
	}
	abs, err := filepath.Abs(out.StateDir)
	if err != nil {
		return out, fmt.Errorf("localpg: state dir: %w", err)
	}
	// One cluster whatever the path that leads to it: its socket folder is written
	// into its configuration.
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	out.StateDir = abs
	return out, nil
}

// Cluster is a running local cluster.
type Cluster struct {
	cfg     Config
	bin     string
	dataDir string
	sockDir string
	asUser  string // run server binaries as this user ("" = as ourselves)
}

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Port is the cluster's TCP port.
func (c *Cluster) Port() int { return c.cfg.Port }

// URL returns a connection string for database db on the cluster, over the Unix
// socket when its path is short enough, else over TCP on 127.0.0.1.
func (c *Cluster) URL(db string) string {
	host := "127.0.0.1"
	if c.sockDir != "" {
		host = c.sockDir
	}
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable", connValue(host), c.cfg.Port, connValue(db))
}

// connValue quotes a keyword/value connection string value when it needs it (a path
// with a space: the checkout of "~/My Projects/streamd" broke every connection).
func connValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " '\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// DatabaseURL returns $STREAMD_DATABASE_URL when set; otherwise it ensures the local
// cluster runs, that DefaultDatabase exists in it, and returns its URL.
func DatabaseURL(ctx context.Context, cfg *Config) (string, error) {
	if v := os.Getenv(EnvDatabaseURL); v != "" {
		return v, nil
	}
	c, err := Ensure(ctx, cfg)
	if err != nil {
		return "", err
	}
	c.cfg.Logger.Debug("using the private cluster", "state_dir", c.cfg.StateDir, "port", c.cfg.Port)
	if err := c.CreateDatabase(ctx, DefaultDatabase); err != nil {
		return "", err
	}
	return c.URL(DefaultDatabase), nil
}

// Ensure starts the local cluster if it is not running, creating it first if it does
// not exist, and returns it. It is safe to call from several processes at once.
func Ensure(ctx context.Context, cfg *Config) (*Cluster, error) {
	c, err := open(cfg)
	if err != nil {
		return nil, err
	}
	unlock, err := c.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()

	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
		if portTaken(c.cfg.Port) {
			return nil, portTakenError(c.cfg.Port) // before making a cluster that cannot start
		}
		if err := c.initdb(ctx); err != nil {
			return nil, err
		}
	}
	changed, err := c.writeConf()
	if err != nil {
		return nil, err
	}
	if c.running(ctx) {
		if changed {
			// Settings that a reload can change take effect now (a new port or
			// wal_level needs db-stop first).
			if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "reload"); err != nil {
				return nil, fmt.Errorf("localpg: pg_ctl reload: %w: %s", err, tail(out))
			}
		}
		return c, nil
	}
	if portTaken(c.cfg.Port) {
		return nil, portTakenError(c.cfg.Port)
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Stop stops the local cluster if it runs (fast shutdown). It keeps the data.
func Stop(ctx context.Context, cfg *Config) error {
	c, err := open(cfg)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err != nil {
		return nil // never created
	}
	if !c.running(ctx) {
		return nil
	}
	out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "fast", "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("localpg: pg_ctl stop: %w: %s", err, out)
	}
	c.cfg.Logger.Info("local postgres stopped", "data_dir", c.dataDir)
	return nil
}

// Restart stops and starts the cluster (immediate shutdown when immediate is true,
// simulating a crash). Tests use it to check that clients survive a restart.
func (c *Cluster) Restart(ctx context.Context, immediate bool) error {
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	// Under the state folder's lock, as Ensure: a process that finds the server
	// stopped mid-restart (a streamd command, another test binary) waits for the
	// restart instead of starting the server itself under the restart's feet.
	unlock, err := c.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("localpg: pg_ctl stop: %w: %s", err, out)
	}
	return c.start(ctx)
}

// CreateDatabase creates database name if it does not exist. Concurrent calls for the
// same name succeed.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("localpg: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("localpg: look up database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" ENCODING 'UTF8' TEMPLATE template0")
	if err != nil && !isDuplicateDatabase(err) {
		return fmt.Errorf("localpg: create database %s: %w", name, err)
	}
	return nil
}

func open(cfg *Config) (*Cluster, error) {
	conf, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	bin := conf.BinDir
	if bin == "" {
		bin, err = findBinaries(conf.Logger)
		if err != nil {
			return nil, err
		}
	} else if !hasBinaries(bin) {
		return nil, fmt.Errorf("%w in %s: need initdb, pg_ctl and postgres there (Debian: apt-get install postgresql), or set %s to use an existing database",
			ErrMissingBinaries, bin, EnvDatabaseURL)
	}
	c := &Cluster{cfg: conf, bin: bin, dataDir: filepath.Join(conf.StateDir, "pg", "data")}
	sock := filepath.Join(conf.StateDir, "pg", "run")
	// A Unix socket path is limited to 107 bytes; fall back to TCP past that.
	if len(sock)+len("/.s.PGSQL.")+6 < 100 {
		c.sockDir = sock
	}
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("localpg: running as root needs a 'postgres' user to run the server as (install Debian's postgresql package): %w", err)
		}
		c.asUser = "postgres"
	}
	return c, nil
}

// findBinaries returns the folder that holds initdb, pg_ctl and postgres: on PATH, or
// the newest /usr/lib/postgresql/*/bin. When none is found and apt-get is usable, it
// installs Debian's postgresql package.
func findBinaries(log *slog.Logger) (string, error) {
	if dir := lookBinaries(); dir != "" {
		return dir, nil
	}
	if os.Geteuid() == 0 {
		if apt, err := exec.LookPath("apt-get"); err == nil {
			log.Info("PostgreSQL server binaries not found; installing Debian's postgresql package")
			env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "postgresql"}} {
				cmd := exec.Command(apt, args...)
				cmd.Env = env
				if out, err := cmd.CombinedOutput(); err != nil {
					return "", fmt.Errorf("%w, and apt-get %s failed: %v: %s", ErrMissingBinaries, args[0], err, tail(out))
				}
			}
			if dir := lookBinaries(); dir != "" {
				return dir, nil
			}
		}
	}
	return "", fmt.Errorf("%w: need initdb, pg_ctl and postgres on PATH or in /usr/lib/postgresql/<version>/bin; install them (Debian: apt-get install postgresql) or set %s to use an existing database", ErrMissingBinaries, EnvDatabaseURL)
}

func lookBinaries() string {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		dir := filepath.Dir(p)
		if hasBinaries(dir) {
			return dir
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, dir := range matches {
		if hasBinaries(dir) {
			return dir
		}
	}
	return ""
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

func (c *Cluster) lock() (func(), error) {
	if err := os.MkdirAll(filepath.Join(c.cfg.StateDir, "pg"), 0o755); err != nil {
		return nil, fmt.Errorf("localpg: create state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(c.cfg.StateDir, "pg", "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("localpg: open lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("localpg: lock state dir: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func (c *Cluster) initdb(ctx context.Context) error {
	c.cfg.Logger.Info("creating local postgres cluster", "data_dir", c.dataDir)
	pgDir := filepath.Join(c.cfg.StateDir, "pg")
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("localpg: create data dir: %w", err)
	}
	if c.sockDir != "" {
		if err := os.MkdirAll(c.sockDir, 0o755); err != nil {
			return fmt.Errorf("localpg: create socket dir: %w", err)
		}
	}
	if c.asUser != "" {
		if err := c.chownToServer(pgDir); err != nil {
			return err
		}
	}
	out, err := c.run(ctx, "initdb", "-D", c.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if err != nil {
		// Leave no half-made cluster behind: the next run starts from nothing again.
		_ = os.RemoveAll(c.dataDir)
		return fmt.Errorf("localpg: initdb: %w: %s", err, tail(out))
	}
	return os.WriteFile(filepath.Join(c.dataDir, "postgresql.conf"),
		append(mustRead(filepath.Join(c.dataDir, "postgresql.conf")), []byte("\ninclude_if_exists = 'streamd.conf'\n")...), 0o600)
}

// writeConf writes the settings that make the cluster ours: its port and socket,
// logical decoding for the tailer, and enough connections for tests and benchmarks.
func (c *Cluster) writeConf() (changed bool, err error) {
	sock := ""
	if c.sockDir != "" {
		sock = c.sockDir
		if err := os.MkdirAll(sock, 0o755); err != nil {
			return false, fmt.Errorf("localpg: create socket dir: %w", err)
		}
	}
	conf := fmt.Sprintf(`# written by streamd's localpg on every start; edit the code, not this file
port = %d
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
wal_level = logical
max_wal_senders = 20
max_replication_slots = 20
max_connections = 300
shared_buffers = 512MB
max_wal_size = 4GB
checkpoint_timeout = 15min
# Queue tables churn: wake autovacuum often enough to keep dead tuples bounded.
autovacuum_naptime = 10s
log_min_messages = warning
log_min_duration_statement = -1
`, c.cfg.Port, sock)
	names := make([]string, 0, len(c.cfg.Settings))
	for name := range c.cfg.Settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		conf += name + " = " + c.cfg.Settings[name] + "\n"
	}
	path := filepath.Join(c.dataDir, "streamd.conf")
	if old, err := os.ReadFile(path); err == nil && string(old) == conf {
		return false, nil
	}
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return false, fmt.Errorf("localpg: write %s: %w", path, err)
	}
	if c.asUser != "" {
		return true, c.chownToServer(filepath.Join(c.cfg.StateDir, "pg"))
	}
	return true, nil
}

func (c *Cluster) running(ctx context.Context) bool {
	removeStaleLockFile(c.dataDir)
	_, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "status")
	return err == nil
}

// removeStaleLockFile deletes the data dir's postmaster.pid when the process it names
// is not a PostgreSQL server: after a crash or a container restart that PID may now
// belong to another process, and pg_ctl would then take the cluster for running (and
// skip starting it) or send that process its stop signal. It reports whether it
// removed the file.
func removeStaleLockFile(dataDir string) bool {
	lock := filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(lock)
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return false // not ours to judge: leave it to PostgreSQL
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && strings.Contains(string(cmdline), "postgres") {
		return false // a PostgreSQL process (or no /proc: pg_ctl decides)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false
	}
	return os.Remove(lock) == nil
}

func (c *Cluster) start(ctx context.Context) error {
	logFile := filepath.Join(c.cfg.StateDir, "pg", "postgres.log")
	if c.asUser != "" {
		// The server writes its log as the postgres user.
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			f.Close()
		}
		_ = c.chownToServer(logFile)
	}
	out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-l", logFile, "-w", "-t", "120", "start")
	if err != nil {
		return fmt.Errorf("localpg: pg_ctl start (port %d; is another server using it? see %s): %w: %s",
			c.cfg.Port, logFile, err, tail(out))
	}
	c.cfg.Logger.Info("local postgres started", "port", c.cfg.Port, "data_dir", c.dataDir)
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	bin := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.asUser != "" {
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			return nil, fmt.Errorf("localpg: running as root needs runuser to drop to the postgres user: %w", err)
		}
		cmd = exec.CommandContext(ctx, runuser, append([]string{"-u", c.asUser, "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	// The server must not inherit our stdout or stderr: a process that waits for
	// them to close (a CI runner) would wait for the server to stop.
	cmd.Stdin = nil
	out, err := cmd.CombinedOutput()
	return out, err
}

func (c *Cluster) chownToServer(path string) error {
	u, err := user.Lookup(c.asUser)
	if err != nil {
		return fmt.Errorf("localpg: look up user %s: %w", c.asUser, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		return fmt.Errorf("localpg: chown %s to %s: %w", path, c.asUser, err)
	}
	// The server user must be able to reach the state folder.
	for dir := filepath.Dir(path); dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil {
			break
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("localpg: %s is not searchable by user %s; choose another STREAMD_STATE_DIR", dir, c.asUser)
		}
	}
	return nil
}

func isDuplicateDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")
}

func mustRead(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}

func tail(out []byte) string {
	s := strings.TrimSpace(string(out))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

// WaitReady polls until the cluster accepts connections or ctx ends.
func (c *Cluster) WaitReady(ctx context.Context) error {
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("localpg: not ready: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
