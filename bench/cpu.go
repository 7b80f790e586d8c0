package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU accounting: what a case costs the client (this process) and the server (the
// PostgreSQL backends of the benchmark's own connections, found by application_name
// and read from /proc). On a 2-core machine shared by both, throughput is bounded by
// 2 cores / (client + server CPU per record), so these say where a ratio is lost.
// The server side is unknown (zero) when the server is not local or the pool has no
// application_name.

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on Linux.
const clockTicks = 100

type cpuSample struct {
	client time.Duration
	server map[int]time.Duration
}

// selfCPU returns the user plus system time of this process.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sampleCPU(ctx context.Context, env *Env) cpuSample {
	s := cpuSample{server: map[int]time.Duration{}, client: selfCPU()}
	rows, err := env.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE application_name <> '' AND application_name = current_setting('application_name')`)
	if err != nil {
		return s
	}
	var pids []int
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	for _, pid := range pids {
		if d, ok := procCPU(pid); ok {
			s.server[pid] = d
		}
	}
	return s
}

// procCPU returns the user plus system time of process pid.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, false
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3 (state); utime is field 14, stime 15
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / clockTicks, true
}

// cpuSince returns the client and server CPU used since s.
func cpuSince(ctx context.Context, env *Env, s cpuSample) (client, server time.Duration) {
	now := sampleCPU(ctx, env)
	client = now.client - s.client
	for pid, d := range now.server {
		server += d - s.server[pid] // a backend started since counts from zero
	}
	return client, server
}

// measure runs runLoad and adds the CPU the client and the server spent on it.
func (e *Env) measure(ctx context.Context, workers int, d time.Duration, op opFunc) (loadResult, error) {
	before := sampleCPU(ctx, e)
	res, err := runLoad(ctx, workers, d, op)
	if err != nil {
		return res, err
	}
	res.clientCPU, res.serverCPU = cpuSince(ctx, e, before)
	return res, nil
}
