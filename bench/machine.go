package bench

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Machine describes the computer the benchmark ran on.
type Machine struct {
	Hostname  string  `json:"hostname"`
	CPUModel  string  `json:"cpu_model"`
	Cores     int     `json:"cores"`
	MemoryGB  float64 `json:"memory_gb"`
	Kernel    string  `json:"kernel,omitempty"`
	GoVersion string  `json:"go_version"`
	// LoadAvgStart and LoadAvgEnd are /proc/loadavg's 1-minute load average when the
	// run started and ended: other work on the machine skews the figures.
	LoadAvgStart float64 `json:"load_avg_start"`
	LoadAvgEnd   float64 `json:"load_avg_end"`
}

// Postgres describes the server and the settings that bound write and read speed.
type Postgres struct {
	Version  string            `json:"version"`
	Settings map[string]string `json:"settings"`
}

// Git is the commit the benchmark ran at.
type Git struct {
	Commit string `json:"commit"`
	// Dirty is true when the benchmarked code (bench/, streams/, sql/) had
	// uncommitted changes.
	Dirty bool `json:"dirty,omitempty"`
}

// settingNames are the PostgreSQL settings recorded with every result.
var settingNames = []string{
	"shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_wal_size",
	"full_page_writes", "wal_buffers", "wal_compression", "commit_delay", "checkpoint_timeout",
	"max_connections", "work_mem", "jit",
}

func machineInfo() Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), LoadAvgStart: loadAvg()}
	m.Hostname, _ = os.Hostname()
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	if m.CPUModel == "" {
		m.CPUModel = runtime.GOARCH
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.MemoryGB = round3(kb / 1024 / 1024)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// loadAvg returns the 1-minute load average, or -1 when unknown.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func postgresInfo(ctx context.Context, pool *pgxpool.Pool) (Postgres, error) {
	p := Postgres{Settings: map[string]string{}}
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&p.Version); err != nil {
		return p, fmt.Errorf("postgres version: %w", err)
	}
	for _, name := range settingNames {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1, true)", name).Scan(&v); err != nil {
			return p, fmt.Errorf("postgres setting %s: %w", name, err)
		}
		p.Settings[name] = v
	}
	return p, nil
}

func gitInfo(ctx context.Context) Git {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var g Git
	if out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output(); err == nil {
		g.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--", "bench", "streams", "sql").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			// Results and RESULTS.md are outputs, not benchmarked code.
			if line != "" && !strings.Contains(line, "bench/results") && !strings.Contains(line, "RESULTS.md") {
				g.Dirty = true
			}
		}
	}
	return g
}

// WaitQuiet waits until the 1-minute load average is below load, for at most d (or
// until ctx ends), so that a run starts on a quiet machine when it can. It logs
// what it waited for.
func WaitQuiet(ctx context.Context, logger *slog.Logger, load float64, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		l := loadAvg()
		if l < load {
			logger.Info("machine quiet", "load_avg", l)
			return
		}
		if time.Now().After(deadline) {
			logger.Warn("machine still busy; running anyway", "load_avg", l, "waited", d)
			return
		}
		logger.Info("waiting for a quiet machine", "load_avg", l, "want_below", load)
		t := time.NewTimer(15 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
