// Command streamd-bench runs streamd's benchmark suite against the project's
// PostgreSQL ($STREAMD_DATABASE_URL, else the local cluster that internal/localpg
// starts), prints a table, and writes bench/results/<date>-<machine>.json, SVG charts
// next to it, and the generated section of bench/RESULTS.md.
//
//	go run ./bench/cmd/streamd-bench -suite quick            # make bench
//	go run ./bench/cmd/streamd-bench -suite full             # make bench-full
//	go run ./bench/cmd/streamd-bench -scenarios profile      # one scenario
//	go run ./bench/cmd/streamd-bench -from-json bench/results/2026-11-22-vm.json  # redraw
//	go run ./bench/cmd/streamd-bench -drop-ballast           # free the growth scenario's disk
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/bench"
	"github.com/streamd/streamd/internal/localpg"
	schema "github.com/streamd/streamd/sql"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "streamd-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	suiteName := flag.String("suite", "quick", "suite: quick, full or tiny")
	scenarios := flag.String("scenarios", "", "comma-separated scenarios to run (default: all)")
	outDir := flag.String("out", "bench/results", "directory for the JSON results and the SVG charts")
	resultsMD := flag.String("results-md", "bench/RESULTS.md", "markdown file whose generated section is rewritten ('' to skip)")
	duration := flag.Duration("duration", 0, "override the suite's duration per case")
	repeats := flag.Int("repeats", 0, "override how many times each scenario runs (the suite's Repeats; results are the median repeat)")
	noWrite := flag.Bool("no-write", false, "print the table only; write no files")
	waitQuiet := flag.Duration("wait-quiet", 0, "wait up to this long for the 1-minute load average to drop below -quiet-load before starting")
	quietLoad := flag.Float64("quiet-load", 1.0, "the load average -wait-quiet waits for")
	fromJSON := flag.String("from-json", "", "run nothing: redraw the charts and the RESULTS.md section from this results file")
	latency := flag.Duration("latency", 0, "run the latency scenario for this long per mode (the full suite's default is 20s; quick and tiny leave it out unless this is set)")
	kafkaE2E := flag.Duration("kafka-e2e", 0, "override how long each of the kafka scenario's end-to-end modes runs (quick 15s, full 20s)")
	growthLog := flag.String("growth-log", "", "override the suite's log sizes for the growth scenario, e.g. 0,1M,10M")
	consumeProfile := flag.String("consume-cpuprofile", "", "write a CPU profile of the kafka scenario's commit-each-poll franz-go consume read (not the target's auto-commit one) to this file (samples labelled side=server or side=franz-go)")
	dropBallast := flag.Bool("drop-ballast", false, "run nothing: drop the growth scenario's kept ballast database (and dead runs' temporary ones)")
	flag.Parse()

	if *fromJSON != "" {
		rep, err := bench.ReadReport(*fromJSON)
		if err != nil {
			return err
		}
		return write(rep, *outDir, *resultsMD)
	}

	suite, err := bench.SuiteByName(*suiteName)
	if err != nil {
		return err
	}
	if *duration > 0 {
		suite.CaseDuration = *duration
	}
	if *repeats > 0 {
		suite.Repeats = *repeats
	}
	if *kafkaE2E > 0 {
		suite.KafkaLatencyDuration = *kafkaE2E
	}
	if *latency > 0 {
		suite.LatencyDuration = *latency
	}
	if *growthLog != "" {
		if suite.GrowthLogEvents, err = parseCounts(*growthLog); err != nil {
			return fmt.Errorf("-growth-log: %w", err)
		}
	}
	var names []string
	if *scenarios != "" {
		for _, n := range strings.Split(*scenarios, ",") {
			n = strings.TrimSpace(n)
			if !bench.Known(n) {
				return fmt.Errorf("unknown scenario %q", n)
			}
			names = append(names, n)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	url, err := localpg.DatabaseURL(ctx, &localpg.Config{Logger: logger})
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	// Enough for the most producer connections plus the Producer's in-flight batches.
	cfg.MaxConns = 32
	// Names the benchmark's backends, whose CPU time the harness reads from /proc.
	cfg.ConnConfig.RuntimeParams["application_name"] = "streamd-bench"
	cfg.MinConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if *dropBallast {
		names, err := bench.DropBallast(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Println("dropped:", strings.Join(names, " "))
		return nil
	}
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	if *waitQuiet > 0 {
		bench.WaitQuiet(ctx, logger, *quietLoad, *waitQuiet)
	}
	t0 := time.Now()
	rep, err := bench.Run(ctx, pool, bench.Options{Suite: suite, Scenarios: names, Logger: logger, ConsumeCPUProfile: *consumeProfile})
	if err != nil {
		return err
	}
	fmt.Printf("\nstreamd-bench suite %s on %s (%s, %d cores), PostgreSQL %s, %.0f s\n\n",
		suite.Name, rep.Machine.Hostname, rep.Machine.CPUModel, rep.Machine.Cores, rep.Postgres.Version, time.Since(t0).Seconds())
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if *noWrite {
		return nil
	}
	return write(rep, *outDir, *resultsMD)
}

// write stores the report's JSON and charts in outDir and rewrites the generated
// section of resultsMD ("" skips it).
func write(rep *bench.Report, outDir, resultsMD string) error {
	if err := rep.WriteCharts(outDir); err != nil {
		return fmt.Errorf("write charts: %w", err)
	}
	path, err := rep.WriteJSON(outDir)
	if err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	fmt.Println("\nwrote", path, "and", len(rep.Charts), "charts")
	if resultsMD != "" {
		rel, err := filepath.Rel(filepath.Dir(resultsMD), outDir)
		if err != nil {
			rel = outDir
		}
		if err := rep.UpdateResultsMD(resultsMD, rel); err != nil {
			return fmt.Errorf("update %s: %w", resultsMD, err)
		}
		fmt.Println("updated", resultsMD)
	}
	return nil
}

// parseCounts parses comma-separated counts such as "0,500k,10M".
func parseCounts(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := int64(1)
		switch {
		case strings.HasSuffix(f, "k"):
			mult, f = 1000, strings.TrimSuffix(f, "k")
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, strings.TrimSuffix(f, "M")
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}
