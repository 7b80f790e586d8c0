package localpg

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// EnvStateDir and EnvPort name the environment variables that choose the private
// cluster: its state folder and its port.
const (
	EnvStateDir = "STREAMD_STATE_DIR"
	EnvPort     = "STREAMD_PG_PORT"
)

// DefaultStateDir is the state folder of the private cluster when Config.StateDir is
// empty: $STREAMD_STATE_DIR, else one folder per user, the same from every working
// directory (a binary on the PATH finds the same database wherever it runs):
// $XDG_STATE_HOME/streamd, else ~/.local/state/streamd, else (for root, whose home the
// postgres user the server runs as cannot reach) $TMPDIR/streamd-state-root.
func DefaultStateDir() string {
	if v := os.Getenv(EnvStateDir); v != "" {
		return v
	}
	if v := os.Getenv("XDG_STATE_HOME"); v != "" {
		return filepath.Join(v, "streamd")
	}
	if home, err := os.UserHomeDir(); err == nil && os.Geteuid() != 0 {
		return filepath.Join(home, ".local", "state", "streamd")
	}
	return filepath.Join(os.TempDir(), "streamd-state-root")
}

// StateDir is the cluster's state folder.
func (c *Cluster) StateDir() string { return c.cfg.StateDir }

// ErrPortTaken is wrapped by the error of a cluster that cannot start because its
// port is taken (by another cluster or another process).
var ErrPortTaken = errors.New("localpg: port taken")

// portTakenError says that port is taken and by what, and how to choose another.
func portTakenError(port int) error {
	holder := "another process"
	if dir := portHolderStateDir(port); dir != "" {
		holder = "the private cluster of state folder " + dir
	}
	return fmt.Errorf("localpg: port %d is taken by %s: choose another port with %s, or another cluster with %s%w",
		port, holder, EnvPort, EnvStateDir, silent{ErrPortTaken})
}

// portTaken reports whether something listens on 127.0.0.1:port.
func portTaken(port int) bool {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// portHolderStateDir returns the state folder of the streamd cluster listening on
// port, read from /proc (the listening socket's process runs in its data directory,
// <state>/pg/data), or "" when that cannot be told (not Linux, another user's
// process, not a streamd cluster).
func portHolderStateDir(port int) string {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil && int(p) == port {
				inodes["socket:["+fields[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return ""
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err != nil || !inodes[target] {
				continue
			}
			cwd, err := os.Readlink(filepath.Join("/proc", p.Name(), "cwd"))
			if err != nil || filepath.Base(cwd) != "data" || filepath.Base(filepath.Dir(cwd)) != "pg" {
				return ""
			}
			return filepath.Dir(filepath.Dir(cwd))
		}
	}
	return ""
}

// Resolved returns the configuration with its defaults applied: the state folder and
// the port a cluster of cfg uses. A nil *Config means the defaults.
func (c *Config) Resolved() (Config, error) { return c.withDefaults() }

// silent wraps an error for errors.Is without adding its text to a message.
type silent struct{ err error }

func (s silent) Error() string { return "" }
func (s silent) Unwrap() error { return s.err }
