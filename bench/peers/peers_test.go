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
		batches: []int{1, 10}, producers: []int{1, 2}}
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
