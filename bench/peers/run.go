package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// result is one row of the table and of the JSON file.
type result struct {
	System     string `json:"system"`
	Durability string `json:"durability"`
	Scenario   string `json:"scenario"` // produce, consume, latency
	Case       string `json:"case"`
	Producers  int    `json:"producers,omitempty"`
	Batch      int    `json:"batch,omitempty"`
	// Records is what was produced (produce), read (consume) or received (latency).
	Records       int64   `json:"records"`
	Seconds       float64 `json:"seconds"`
	RecordsPerSec float64 `json:"records_per_sec,omitempty"`
	MBPerSec      float64 `json:"mb_per_sec,omitempty"`
	// RatePerSec is the achieved send rate of a latency case.
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	P50Ms      float64 `json:"p50_ms,omitempty"`
	P99Ms      float64 `json:"p99_ms,omitempty"`
	MaxMs      float64 `json:"max_ms,omitempty"`
	// RatioToStreamd is records/s (produce, consume) or p50 (latency) over streamd's
	// in the same case; for produce, the median of the rounds' ratios.
	RatioToStreamd float64 `json:"ratio_to_streamd,omitempty"`
	// Rounds are a produce case's records/s in each round (the row is the median
	// round), and RoundRatios each round's ratio to streamd's run in the same round
	// (RatioToStreamd is their median).
	Rounds      []float64 `json:"rounds_records_per_sec,omitempty"`
	RoundRatios []float64 `json:"rounds_ratio_to_streamd,omitempty"`
	Note        string    `json:"note,omitempty"`
	Error       string    `json:"error,omitempty"`
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// produceCase runs producers goroutines, each sending batches of batch payloads to a
// fresh topic for d. It returns the result and the topic, which the caller drops.
func produceCase(ctx context.Context, sys system, topic string, producers, batch int, d time.Duration) (result, error) {
	r := result{System: sys.name(), Durability: sys.durability(), Scenario: "produce",
		Case: fmt.Sprintf("produce 1KiB p=%d b=%d", producers, batch), Producers: producers, Batch: batch}
	if err := sys.newTopic(ctx, topic); err != nil {
		return r, fmt.Errorf("new topic: %w", err)
	}
	ps := make([]producer, producers)
	for w := range ps {
		p, err := sys.newProducer(ctx, topic, w, producers)
		if err != nil {
			return r, err
		}
		ps[w] = p
		defer p.close()
	}
	payload := makePayload(0)
	var total atomic.Int64
	errs := make(chan error, producers)
	t0 := time.Now()
	end := t0.Add(d)
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { // owner: produceCase; exits at end or on an error
			defer wg.Done()
			batchOf := make([][]byte, batch)
			for i := range batchOf {
				batchOf[i] = payload
			}
			for time.Now().Before(end) {
				if err := p.send(ctx, batchOf); err != nil {
					errs <- err
					return
				}
				total.Add(int64(batch))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	if err := <-errs; err != nil {
		return r, err
	}
	r.Records, r.Seconds = total.Load(), round3(elapsed.Seconds())
	r.RecordsPerSec = round3(float64(r.Records) / elapsed.Seconds())
	r.MBPerSec = round3(r.RecordsPerSec * payloadSize / 1e6)
	return r, nil
}

// consumeCase reads the n records of topic with a fresh consumer group, timed from
// the consumer's creation (so including its join) to the n-th delivery.
func consumeCase(ctx context.Context, sys system, topic string, n int64) (result, error) {
	r := result{System: sys.name(), Durability: sys.durability(), Scenario: "consume",
		Case: "consume 1KiB 1 group", Producers: 0}
	if n == 0 {
		return r, errors.New("nothing to consume")
	}
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var got atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	t0 := time.Now()
	errc := make(chan error, 1)
	go func() { // owner: consumeCase; exits when cctx ends
		errc <- sys.consume(cctx, topic, "bench", func() {}, func([]byte) {
			if got.Add(1) >= n {
				once.Do(func() { close(done) })
			}
		})
	}()
	var elapsed time.Duration
	select {
	case <-done:
		elapsed = time.Since(t0)
	case err := <-errc:
		if err == nil {
			err = fmt.Errorf("consumer stopped after %d of %d records", got.Load(), n)
		}
		return r, err
	case <-cctx.Done():
		cancel()
		<-errc
		return r, fmt.Errorf("read %d of %d records within 90s", got.Load(), n)
	}
	cancel()
	if err := <-errc; err != nil {
		return r, err
	}
	r.Records, r.Seconds = n, round3(elapsed.Seconds())
	r.RecordsPerSec = round3(float64(n) / elapsed.Seconds())
	r.MBPerSec = round3(r.RecordsPerSec * payloadSize / 1e6)
	r.Note = fmt.Sprintf("the first %d records (the same count for every system) of the topic the p=4 b=100 produce case wrote; %d delivered (at-least-once)", n, got.Load())
	return r, nil
}

// latencyCase sends one message per call at rate messages/s in total from producers
// goroutines (each at its share, paced by a ticker) for d, to a topic that a consumer
// reads from before the first send. Latency is from the send call's start to the
// consumer's delivery, so it includes the write's durability wait.
func latencyCase(ctx context.Context, sys system, topic string, rate, producers int, d time.Duration) (result, error) {
	r := result{System: sys.name(), Durability: sys.durability(), Scenario: "latency",
		Case: fmt.Sprintf("latency 1KiB %d/s p=%d", rate, producers), Producers: producers, Batch: 1}
	if err := sys.newTopic(ctx, topic); err != nil {
		return r, fmt.Errorf("new topic: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	samples := make([]time.Duration, 0, rate*int(d/time.Second+1))
	var bad atomic.Int64
	ready := make(chan struct{})
	var readyOnce sync.Once
	errc := make(chan error, 1)
	go func() { // owner: latencyCase; exits when cctx ends
		errc <- sys.consume(cctx, topic, "latency", func() { readyOnce.Do(func() { close(ready) }) }, func(p []byte) {
			now := time.Now().UnixNano()
			t, err := payloadTime(p)
			if err != nil {
				bad.Add(1)
				return
			}
			mu.Lock()
			samples = append(samples, time.Duration(now-t))
			mu.Unlock()
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		return r, fmt.Errorf("consumer: %w", err)
	case <-time.After(30 * time.Second):
		return r, errors.New("consumer not ready within 30s")
	}
	ps := make([]producer, producers)
	for w := range ps {
		p, err := sys.newProducer(ctx, topic, w, producers)
		if err != nil {
			return r, err
		}
		ps[w] = p
		defer p.close()
	}
	var sent atomic.Int64
	perr := make(chan error, producers)
	t0 := time.Now()
	end := t0.Add(d)
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { // owner: latencyCase; exits at end or on an error
			defer wg.Done()
			tick := time.NewTicker(time.Second * time.Duration(producers) / time.Duration(rate))
			defer tick.Stop()
			for time.Now().Before(end) {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if err := p.send(ctx, [][]byte{makePayload(time.Now().UnixNano())}); err != nil {
					perr <- err
					return
				}
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(perr)
	if err := <-perr; err != nil {
		return r, err
	}
	// Wait for the consumer to see everything, or give up after 10s.
	giveUp := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := int64(len(samples))
		mu.Unlock()
		if n+bad.Load() >= sent.Load() || time.Now().After(giveUp) {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	cancel()
	if err := <-errc; err != nil {
		return r, err
	}
	mu.Lock()
	defer mu.Unlock()
	if len(samples) == 0 {
		return r, errors.New("no message received")
	}
	slices.Sort(samples)
	q := func(f float64) float64 {
		return round3(float64(samples[min(len(samples)-1, int(f*float64(len(samples))))]) / 1e6)
	}
	r.Records, r.Seconds = int64(len(samples)), round3(elapsed.Seconds())
	r.RatePerSec = round3(float64(sent.Load()) / elapsed.Seconds())
	r.P50Ms, r.P99Ms, r.MaxMs = q(0.50), q(0.99), round3(float64(samples[len(samples)-1])/1e6)
	if missing := sent.Load() - int64(len(samples)); missing > 0 || bad.Load() > 0 {
		r.Note = fmt.Sprintf("%d sent, %d received, %d unreadable", sent.Load(), len(samples), bad.Load())
	}
	return r, nil
}
