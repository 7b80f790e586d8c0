package main

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"
)

func TestPayloadTime(t *testing.T) {
	t.Parallel()
	p := makePayload(1234567890123)
	if len(p) != payloadSize {
		t.Fatalf("payload of %d bytes, want %d", len(p), payloadSize)
	}
	// As a jsonb column returns it: keys reordered, a space after each colon.
	for _, in := range [][]byte{p, []byte(`{"p": "xx", "t": 1234567890123}`)} {
		got, err := payloadTime(in)
		if err != nil || got != 1234567890123 {
			t.Fatalf("payloadTime(%.30q) = %d, %v", in, got, err)
		}
	}
	if _, err := payloadTime([]byte(`{"p":"x"}`)); err == nil {
		t.Fatal("payloadTime of a payload without t: no error")
	}
}

// TestPeersTiny runs every system and case at a tiny size: streamd's PostgreSQL must
// be reachable and nats-server and redis-server installed (bench/peers/setup.sh);
// it fails, not skips, when they are not.
func TestPeersTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := options{duration: 200 * time.Millisecond, latencyDuration: 500 * time.Millisecond, rate: 200, latencyProds: 2,
		repeats: 2, batches: []int{1, 10}, producers: []int{1, 2}}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := run(ctx, logger, o)
	if err != nil {
		t.Fatal(err)
	}
	for name, why := range rep.Skipped {
		t.Errorf("%s skipped: %s", name, why)
	}
	seen := map[string]int{}
	for _, r := range rep.Results {
		if r.Error != "" {
			t.Errorf("%s %s: %s", r.System, r.Case, r.Error)
		}
		if r.Records == 0 && r.Error == "" {
			t.Errorf("%s %s: no records", r.System, r.Case)
		}
		seen[r.System]++
	}
	for _, name := range []string{"streamd", "streamd+tailer", "watermill-sql", "nats-jetstream", "redis-streams"} {
		if seen[name] == 0 {
			t.Errorf("no result for %s", name)
		}
	}
}

// TestMedianRounds: a produce case's row is its median round, and its ratio to
// streamd the median of the rounds' ratios, each round against streamd's run of the
// same round; a failed round counts in neither.
func TestMedianRounds(t *testing.T) {
	t.Parallel()
	rate := func(xs ...float64) []result {
		rs := make([]result, len(xs))
		for i, x := range xs {
			rs[i] = result{System: "x", RecordsPerSec: x, Records: int64(x)}
			if x < 0 {
				rs[i] = result{System: "x", Error: "boom"}
			}
		}
		return rs
	}
	ref := rate(100, 100, 400, 50)
	got := medianRounds(rate(100, 300, 200, -1), ref)
	if got.RecordsPerSec != 200 || got.Records != 200 {
		t.Fatalf("median round %v, want the one of 200 records/s", got.RecordsPerSec)
	}
	// Ratios 1, 3, 0.5 (the failed fourth round has none): median 1, although the
	// ratio of the median rates (200 / streamd's median 100) would say 2.
	if got.RatioToStreamd != 1 || len(got.RoundRatios) != 3 {
		t.Fatalf("ratio %v from %v, want 1 from 3 rounds", got.RatioToStreamd, got.RoundRatios)
	}
	if got.Note != "1 of 4 rounds failed" {
		t.Fatalf("note %q", got.Note)
	}
	if all := medianRounds(rate(-1, -1), ref); all.Error != "boom" {
		t.Fatalf("every round failed: %+v", all)
	}
}
