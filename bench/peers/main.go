// Command peers measures streamd's peers in the same run as streamd (issue 8):
// Watermill's SQL Pub/Sub on streamd's PostgreSQL, NATS JetStream (Debian's
// nats-server, file storage) and Redis Streams (Debian's redis-server, appendfsync
// always), each started on 127.0.0.1 in a temp dir and stopped afterwards. It prints
// a table and writes bench/results/peers-<date>-<machine>.json. See bench/PEERS.md.
//
// It is a module of its own so that the peers' clients stay out of streamd's go.mod.
// Run `bench/peers/setup.sh` first (it installs the two servers), then `go run .` here.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/localpg"
	schema "github.com/streamd/streamd/sql"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// options are the sizes of a run; quickOptions is `make bench-peers`.
type options struct {
	duration        time.Duration // per produce case and round
	repeats         int           // rounds of every produce case
	latencyDuration time.Duration // per latency case
	rate            int           // latency cases: messages/s in total
	latencyProds    int
	batches         []int
	producers       []int
	systems         map[string]bool // nil means all
	// appendsInFlight is streamd's ClientConfig.MaxAppendsInFlight (0: the library's
	// default), so that a run can compare settings of the shared transactions.
	appendsInFlight int
	out             string // results folder; "" writes nothing
}

func quickOptions() options {
	return options{duration: 3 * time.Second, repeats: 3, latencyDuration: 5 * time.Second, rate: 500, latencyProds: 4,
		batches: []int{1, 100}, producers: []int{1, 4}, out: "../results"}
}

func main() {
	o := quickOptions()
	flag.DurationVar(&o.duration, "duration", o.duration, "duration of each produce case in each round")
	flag.IntVar(&o.repeats, "repeats", o.repeats, "rounds of every produce case (the systems take turns in each; the table gives medians)")
	flag.DurationVar(&o.latencyDuration, "latency-duration", o.latencyDuration, "duration of each latency case")
	flag.IntVar(&o.rate, "rate", o.rate, "latency cases: messages per second in total")
	only := flag.String("systems", "", "comma-separated systems to run (streamd,watermill-sql,nats-jetstream,redis-streams); default all")
	flag.StringVar(&o.out, "out", o.out, "folder for the JSON result (empty: none)")
	flag.IntVar(&o.appendsInFlight, "streamd-appends-in-flight", 0, "streamd's ClientConfig.MaxAppendsInFlight (0: its default; -1: a transaction per Produce call)")
	flag.Parse()
	if *only != "" {
		o.systems = map[string]bool{"streamd": true}
		for _, s := range strings.Split(*only, ",") {
			o.systems[strings.TrimSpace(s)] = true
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rep, err := run(ctx, logger, o)
	if rep != nil {
		printTable(os.Stdout, rep)
		// An interrupted or failed run prints what it has but writes no file, so it
		// cannot replace a complete one.
		if o.out != "" && err == nil {
			if path, werr := writeReport(o.out, rep); werr != nil {
				logger.Error("write report", "error", werr)
			} else {
				fmt.Println("\nwrote", path)
			}
		}
	}
	if err != nil {
		logger.Error("peers", "error", err)
		os.Exit(1)
	}
}

// report is the JSON file.
type report struct {
	Date      time.Time         `json:"date"`
	Commit    string            `json:"commit"`
	Machine   machine           `json:"machine"`
	Postgres  map[string]string `json:"postgres"`
	Servers   map[string]string `json:"servers"`
	Durations map[string]string `json:"durations"`
	Skipped   map[string]string `json:"skipped,omitempty"`
	Results   []result          `json:"results"`
}

type machine struct {
	Hostname     string  `json:"hostname"`
	CPUModel     string  `json:"cpu_model"`
	Cores        int     `json:"cores"`
	GoVersion    string  `json:"go_version"`
	LoadAvgStart string  `json:"load_avg_start"`
	LoadAvgEnd   string  `json:"load_avg_end"`
	Seconds      float64 `json:"seconds"`
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func run(ctx context.Context, logger *slog.Logger, o options) (*report, error) {
	t0 := time.Now()
	rep := &report{Date: t0.UTC(), Postgres: map[string]string{}, Servers: map[string]string{}, Skipped: map[string]string{},
		Durations: map[string]string{"produce_case": o.duration.String(), "produce_rounds": strconv.Itoa(max(1, o.repeats)), "latency_case": o.latencyDuration.String()}}
	rep.Machine = machine{CPUModel: cpuModel(), Cores: runtime.NumCPU(), GoVersion: runtime.Version(), LoadAvgStart: loadAvg()}
	rep.Machine.Hostname, _ = os.Hostname()
	if out, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		rep.Commit = strings.TrimSpace(string(out))
	}
	defer func() {
		rep.Machine.LoadAvgEnd = loadAvg()
		rep.Machine.Seconds = round3(time.Since(t0).Seconds())
	}()
	want := func(name string) bool { return o.systems == nil || o.systems[name] }

	url, err := localpg.DatabaseURL(ctx, &localpg.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["application_name"] = "streamd-bench-peers"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var v string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&v); err == nil {
		rep.Postgres["version"] = v
	}
	for _, name := range []string{"fsync", "synchronous_commit", "wal_sync_method", "commit_delay", "shared_buffers", "wal_level"} {
		if err := pool.QueryRow(ctx, "SELECT current_setting($1, true)", name).Scan(&v); err == nil {
			rep.Postgres[name] = v
		}
	}

	sd := newStreamd(pool, logger, "streamd", 10*time.Millisecond, nil)
	if o.appendsInFlight != 0 {
		sd.client = streams.NewClient(pool, &streams.ClientConfig{Logger: logger, MaxAppendsInFlight: o.appendsInFlight})
	}
	rep.Servers["streamd"] = fmt.Sprintf("this commit, on the PostgreSQL above; Produce's shared transactions: MaxAppendsInFlight %d (0: the default, %d)",
		o.appendsInFlight, streams.DefaultMaxAppendsInFlight)
	systems := []system{sd}
	if want("watermill-sql") {
		wm, err := newWatermill(url, 10*time.Millisecond, 500)
		if err != nil {
			return rep, err
		}
		defer wm.close()
		systems = append(systems, wm)
		rep.Servers["watermill-sql"] = "github.com/ThreeDotsLabs/watermill-sql/v3 v3.1.0 on the PostgreSQL above"
	}
	if want("nats-jetstream") {
		if srv, err := startNATS(ctx); err != nil {
			rep.Skipped["nats-jetstream"] = err.Error()
			logger.Warn("skip nats-jetstream", "error", err)
		} else {
			defer srv.stop()
			ns, err := newNATS("nats://"+srv.addr, srv.version)
			if err != nil {
				return rep, err
			}
			defer ns.close()
			systems = append(systems, ns)
			rep.Servers["nats-jetstream"] = srv.version
		}
	}
	if want("redis-streams") {
		if srv, err := startRedis(ctx); err != nil {
			rep.Skipped["redis-streams"] = err.Error()
			logger.Warn("skip redis-streams", "error", err)
		} else {
			defer srv.stop()
			rs := newRedis(srv.addr, srv.version)
			defer rs.close()
			systems = append(systems, rs)
			rep.Servers["redis-streams"] = srv.version
		}
	}

	seq := 0
	topicName := func(sys system, what string) string {
		seq++
		return fmt.Sprintf("bench_peers_%s_%s_%d_%d", strings.NewReplacer("-", "_", "+", "_").Replace(sys.name()), what, t0.Unix()%100000, seq)
	}
	drop := func(sys system, topic string) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := sys.dropTopic(dctx, topic); err != nil {
			logger.Warn("drop topic", "system", sys.name(), "topic", topic, "error", err)
		}
	}
	add := func(r result, err error) {
		if err != nil {
			r.Error = err.Error()
			logger.Warn("case failed", "system", r.System, "case", r.Case, "error", err)
		} else {
			logger.Info("case", "system", r.System, "case", r.Case, "records_per_sec", int(r.RecordsPerSec), "p50_ms", r.P50Ms, "p99_ms", r.P99Ms)
		}
		rep.Results = append(rep.Results, r)
	}

	// Produce: every case runs in o.repeats rounds, and the systems take turns within
	// each round (the first system of a round rotating), so that background load on
	// the shared machine hits them alike; a system's row is its median round, and its
	// ratio to streamd the median of the rounds' ratios (each against streamd's run of
	// the same round, next to it in time). The topics of the last case's last round (4
	// producers, largest batch) are kept for the consume case.
	keep := map[string]string{}
	keepN := map[string]int64{}
	rounds := max(1, o.repeats)
	for _, b := range o.batches {
		for _, p := range o.producers {
			last := b == o.batches[len(o.batches)-1] && p == o.producers[len(o.producers)-1]
			runs := make([][]result, len(systems)) // [system][round]
			for round := 0; round < rounds; round++ {
				for k := range systems {
					i := (k + round) % len(systems)
					sys := systems[i]
					if ctx.Err() != nil {
						return rep, ctx.Err()
					}
					topic := topicName(sys, "produce")
					r, err := produceCase(ctx, sys, topic, p, b, o.duration)
					if err != nil {
						r.Error = err.Error()
						logger.Warn("case failed", "system", r.System, "case", r.Case, "round", round+1, "error", err)
					} else {
						logger.Info("case", "system", r.System, "case", r.Case, "round", round+1, "records_per_sec", int(r.RecordsPerSec))
					}
					runs[i] = append(runs[i], r)
					if last && round == rounds-1 && err == nil {
						keep[sys.name()], keepN[sys.name()] = topic, r.Records
					} else {
						drop(sys, topic)
					}
				}
			}
			for i := range systems {
				rep.Results = append(rep.Results, medianRounds(runs[i], runs[0]))
			}
		}
	}
	// streamd's batching producer, for reference: one goroutine, ProduceAsync.
	{
		topic := topicName(sd, "async")
		r := result{System: sd.name(), Durability: sd.durability(), Scenario: "produce", Case: "produce 1KiB streams.Producer async", Producers: 1}
		err := sd.newTopic(ctx, topic)
		if err == nil {
			var n int64
			var el time.Duration
			n, el, err = sd.asyncProduce(ctx, topic, o.duration)
			r.Records, r.Seconds = n, round3(el.Seconds())
			if el > 0 {
				r.RecordsPerSec = round3(float64(n) / el.Seconds())
				r.MBPerSec = round3(r.RecordsPerSec * payloadSize / 1e6)
			}
			r.Note = "one goroutine calling ProduceAsync, keyed records over 4 partitions, default config (batches up to 1000, MaxInFlight 4); time includes the final Flush"
		}
		add(r, err)
		drop(sd, topic)
	}

	// Consume: one consumer group (durable consumer) reads what the last produce
	// case wrote, the same number of records for every system: the fewest that any
	// system's last produce case wrote (a faster producer left a longer topic).
	var consumeN int64
	for _, sys := range systems {
		if n, ok := keepN[sys.name()]; ok && n > 0 && (consumeN == 0 || n < consumeN) {
			consumeN = n
		}
	}
	for _, sys := range systems {
		topic, ok := keep[sys.name()]
		if !ok {
			continue
		}
		add(consumeCase(ctx, sys, topic, consumeN))
		drop(sys, topic)
	}

	// Latency at a fixed rate; streamd twice: polling (FetchMaxWait 10ms, as
	// Watermill's PollInterval here) and woken by an in-process WAL tailer.
	lat := append([]system(nil), systems...)
	if hub, stopTailer, err := startTailer(ctx, logger, url); err != nil {
		rep.Skipped["streamd+tailer"] = err.Error()
		logger.Warn("skip streamd+tailer", "error", err)
	} else {
		defer stopTailer()
		lat = append([]system{lat[0], newStreamd(pool, logger, "streamd+tailer", 0, hub)}, lat[1:]...)
	}
	for _, sys := range lat {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		topic := topicName(sys, "latency")
		add(latencyCase(ctx, sys, topic, o.rate, o.latencyProds, o.latencyDuration))
		drop(sys, topic)
	}
	addRatios(rep.Results)
	return rep, nil
}

// startTailer runs a wakeup.Broadcaster with NoNotify (the WAL tailer in this
// process, waking a Hub directly) and waits until it streams.
func startTailer(ctx context.Context, logger *slog.Logger, url string) (*wakeup.Hub, func(), error) {
	hub := wakeup.NewHub()
	b, err := wakeup.NewBroadcaster(&wakeup.BroadcasterConfig{ConnString: url, Hub: hub, Logger: logger, NoNotify: true})
	if err != nil {
		return nil, nil, err
	}
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // owner: run (stopped by the returned func); exits when tctx ends
		defer close(done)
		if err := b.Run(tctx); err != nil {
			logger.Warn("tailer", "error", err)
		}
	}()
	stop := func() { cancel(); <-done }
	deadline := time.Now().Add(30 * time.Second)
	for !b.Streaming() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, nil, fmt.Errorf("tailer not streaming within 30s")
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	return hub, stop, nil
}

// addRatios sets each row's ratio to streamd's row of the same case, except the
// produce cases' rows, whose ratio medianRounds set from the rounds.
func addRatios(rs []result) {
	ref := map[string]result{}
	for _, r := range rs {
		if r.System == "streamd" && r.Error == "" {
			ref[r.Case] = r
		}
	}
	for i := range rs {
		s, ok := ref[rs[i].Case]
		if !ok || rs[i].Error != "" || rs[i].RoundRatios != nil {
			continue
		}
		switch {
		case rs[i].Scenario == "latency" && s.P50Ms > 0:
			rs[i].RatioToStreamd = round3(rs[i].P50Ms / s.P50Ms)
		case rs[i].Scenario != "latency" && s.RecordsPerSec > 0:
			rs[i].RatioToStreamd = round3(rs[i].RecordsPerSec / s.RecordsPerSec)
		}
	}
}

// medianRounds makes one row of a system's rounds of a produce case: the round of
// median records/s (the lower of the two middle ones for an even count), every
// round's rate, and its ratio to streamd as the median of the rounds' ratios, each
// round against streamd's run of the same round (ref, index for index). A round
// that failed counts in neither; a case whose every round failed is the first
// round's error.
func medianRounds(runs, ref []result) result {
	var ok []result
	var rates, ratios []float64
	for j, r := range runs {
		if r.Error != "" {
			continue
		}
		ok = append(ok, r)
		rates = append(rates, r.RecordsPerSec)
		if j < len(ref) && ref[j].Error == "" && ref[j].RecordsPerSec > 0 {
			ratios = append(ratios, round3(r.RecordsPerSec/ref[j].RecordsPerSec))
		}
	}
	if len(ok) == 0 {
		return runs[0]
	}
	slices.SortFunc(ok, func(a, b result) int { return cmp.Compare(a.RecordsPerSec, b.RecordsPerSec) })
	out := ok[(len(ok)-1)/2]
	out.Rounds = rates
	if len(ratios) > 0 {
		out.RoundRatios = ratios
		sorted := slices.Clone(ratios)
		slices.Sort(sorted)
		out.RatioToStreamd = sorted[(len(sorted)-1)/2]
	}
	if failed := len(runs) - len(ok); failed > 0 {
		out.Note = fmt.Sprintf("%d of %d rounds failed", failed, len(runs))
	}
	return out
}

func printTable(f *os.File, rep *report) {
	fmt.Fprintf(f, "\nstreamd peers, %s, %d cores, load average %s -> %s, %.0f s\n", rep.Machine.CPUModel, rep.Machine.Cores, rep.Machine.LoadAvgStart, rep.Machine.LoadAvgEnd, rep.Machine.Seconds)
	fmt.Fprintf(f, "PostgreSQL %s fsync=%s synchronous_commit=%s\n\n", rep.Postgres["version"], rep.Postgres["fsync"], rep.Postgres["synchronous_commit"])
	tw := tabwriter.NewWriter(f, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tsystem\trecords/s\trounds' records/s\tMB/s\tp50 ms\tp99 ms\tvs streamd\trounds' ratios\t")
	for _, r := range rep.Results {
		num := func(x float64, prec int) string {
			if x == 0 {
				return "-"
			}
			return strconv.FormatFloat(x, 'f', prec, 64)
		}
		rps, mbs := num(r.RecordsPerSec, 0), num(r.MBPerSec, 1)
		if r.Scenario == "latency" {
			rps, mbs = num(r.RatePerSec, 0)+" sent", "-"
		}
		ratio := num(r.RatioToStreamd, 2)
		if r.Error != "" {
			rps, mbs, ratio = "error", "-", "-"
		}
		list := func(xs []float64, prec int) string {
			if len(xs) < 2 {
				return "-"
			}
			parts := make([]string, len(xs))
			for i, x := range xs {
				parts[i] = strconv.FormatFloat(x, 'f', prec, 64)
			}
			return strings.Join(parts, " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Case, r.System, rps, list(r.Rounds, 0), mbs, num(r.P50Ms, 2), num(r.P99Ms, 2), ratio, list(r.RoundRatios, 2))
	}
	_ = tw.Flush()
	fmt.Fprintln(f, "\ndurability:")
	seen := map[string]bool{}
	for _, r := range rep.Results {
		if !seen[r.System] {
			seen[r.System] = true
			fmt.Fprintf(f, "  %-15s %s\n", r.System, r.Durability)
		}
	}
	for name, why := range rep.Skipped {
		fmt.Fprintf(f, "  skipped %s: %s\n", name, why)
	}
}

func writeReport(dir string, rep *report) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	host := rep.Machine.Hostname
	if host == "" {
		host = "unknown"
	}
	path := filepath.Join(dir, fmt.Sprintf("peers-%s-%s.json", rep.Date.Format("2006-01-02"), host))
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}
