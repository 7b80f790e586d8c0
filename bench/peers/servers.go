package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// server is a peer's server process started by the bench: on 127.0.0.1, on a free
// port, with its data in a temporary directory. stop kills it and removes the
// directory; it is safe to call more than once.
type server struct {
	name    string
	addr    string
	version string
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
	log     *os.File
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startServer runs bin with args in dir (its own process group, so that stop reaches
// it alone) and waits until addr accepts connections.
func startServer(ctx context.Context, name, dir, addr string, bin string, args ...string) (*server, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s := &server{name: name, addr: addr, dir: dir, cmd: cmd, exited: make(chan struct{}), log: logf}
	go func() { // owner: the server; exits when the process does
		_ = cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return s, nil
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(logf.Name())
			s.stop()
			return nil, fmt.Errorf("%s exited at start: %s", name, strings.TrimSpace(string(out)))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling interval
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s not listening on %s within 15s", name, addr)
		}
	}
}

// stop sends SIGTERM, then SIGKILL after 5s, and removes the data directory.
func (s *server) stop() {
	if s == nil || s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	_ = s.log.Close()
	_ = os.RemoveAll(s.dir)
	s.cmd = nil
}

func binVersion(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// startNATS starts Debian's nats-server with JetStream file storage in a temp dir.
func startNATS(ctx context.Context) (*server, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return nil, errors.New("nats-server not found: run bench/peers/setup.sh")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "streamd-peers-nats-")
	if err != nil {
		return nil, err
	}
	// nats-server 2.9 (Debian 12) has no jetstream sync_interval option: the file
	// store writes each message before acknowledging it but does not fsync it.
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\nhttp: 0\njetstream {\n  store_dir: %q\n}\n", port, filepath.Join(dir, "js"))
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	s, err := startServer(ctx, "nats-server", dir, "127.0.0.1:"+strconv.Itoa(port), bin, "-c", filepath.Join(dir, "nats.conf"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.version = binVersion(bin, "--version")
	return s, nil
}

// startRedis starts Debian's redis-server with appendonly yes, appendfsync always and
// no RDB snapshots, in a temp dir.
func startRedis(ctx context.Context) (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found: run bench/peers/setup.sh")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "streamd-peers-redis-")
	if err != nil {
		return nil, err
	}
	s, err := startServer(ctx, "redis-server", dir, "127.0.0.1:"+strconv.Itoa(port), bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--protected-mode", "yes", "--daemonize", "no", "--logfile", "")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// "Redis server v=7.0.15 sha=... malloc=..." -> "redis-server 7.0.15"
	s.version = "redis-server " + strings.TrimPrefix(strings.Fields(binVersion(bin, "--version") + " x x v=unknown")[2], "v=")
	return s, nil
}
