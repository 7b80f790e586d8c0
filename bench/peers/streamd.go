package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// streamdPartitions is the partition count of every streamd topic: producer w of 4
// owns partition w (as a Kafka producer batches per partition); one producer goes
// round the partitions.
const streamdPartitions = 4

// streamdSystem is streamd through its Go packages: streams.Client.Produce (one
// transaction per batch, explicit partitions) and a consumergroup member.
type streamdSystem struct {
	pool   *pgxpool.Pool
	client *streams.Client
	logger *slog.Logger
	// label is the table's name for this configuration.
	label string
	// fetchMaxWait is the consumer's poll bound when no wake-ups arrive.
	fetchMaxWait time.Duration
	// hub, when set, wakes the consumer (an in-process WAL tailer).
	hub *wakeup.Hub
}

func newStreamd(pool *pgxpool.Pool, logger *slog.Logger, label string, fetchMaxWait time.Duration, hub *wakeup.Hub) *streamdSystem {
	return &streamdSystem{pool: pool, client: streams.NewClient(pool, nil), logger: logger, label: label, fetchMaxWait: fetchMaxWait, hub: hub}
}

func (s *streamdSystem) name() string { return s.label }

func (s *streamdSystem) durability() string {
	return "commit = PostgreSQL transaction commit (synchronous_commit and fsync as recorded: WAL flushed before the ack)"
}

func (s *streamdSystem) newTopic(ctx context.Context, topic string) error {
	return s.client.CreateStream(ctx, topic, streamdPartitions)
}

func (s *streamdSystem) dropTopic(ctx context.Context, topic string) error {
	admin := consumergroup.NewAdmin(s.pool)
	for _, g := range []string{"bench", "latency"} {
		if err := admin.DeleteGroup(ctx, topic, g, true); err != nil && !isNotFound(err) {
			s.logger.Debug("delete group", "group", g, "error", err)
		}
	}
	return s.client.DeleteStream(ctx, topic)
}

// isNotFound reports errors of a missing group, which dropTopic ignores.
func isNotFound(err error) bool {
	return errors.Is(err, consumergroup.ErrGroupNotFound)
}

type streamdProducer struct {
	client     *streams.Client
	topic      string
	w, workers int
	i          int
}

func (s *streamdSystem) newProducer(_ context.Context, topic string, w, workers int) (producer, error) {
	return &streamdProducer{client: s.client, topic: topic, w: w, workers: workers}, nil
}

func (p *streamdProducer) send(ctx context.Context, payloads [][]byte) error {
	part := int32((p.w + p.i*p.workers) % streamdPartitions)
	p.i++
	recs := make([]streams.Record, len(payloads))
	for i, d := range payloads {
		recs[i] = streams.Record{Stream: p.topic, Partition: &part, EventType: "bench", Data: d}
	}
	_, err := p.client.Produce(ctx, recs...)
	return err
}

func (p *streamdProducer) close() {}

func (s *streamdSystem) consume(ctx context.Context, topic, group string, ready func(), deliver func([]byte)) error {
	c, err := consumergroup.New(s.pool, &consumergroup.Config{
		Stream:       topic,
		Group:        group,
		MaxBatchSize: 500,
		FetchMaxWait: s.fetchMaxWait,
		Wakeups:      s.hub,
		Logger:       s.logger,
		OnAssigned:   func(context.Context, consumergroup.Membership, []int32) { ready() },
	})
	if err != nil {
		return err
	}
	err = c.Run(ctx, func(_ context.Context, b *consumergroup.Batch) error {
		for i := range b.Events {
			deliver(b.Events[i].Data)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	return nil
}

func (s *streamdSystem) close() {}

// asyncProducer measures streams.Producer: one goroutine calling ProduceAsync (the
// producer forms the batches: up to 1000 records, MaxInFlight 4), keyed records over
// the partitions. It returns the records acknowledged within d plus those flushed
// after it (the time includes the final Flush).
func (s *streamdSystem) asyncProduce(ctx context.Context, topic string, d time.Duration) (int64, time.Duration, error) {
	p, err := streams.NewProducer(s.pool, nil)
	if err != nil {
		return 0, 0, err
	}
	payload := makePayload(0)
	var failed error
	done := func(_ streams.Position, err error) {
		if err != nil && failed == nil {
			failed = err
		}
	}
	t0 := time.Now()
	var n int64
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for time.Since(t0) < d && ctx.Err() == nil {
		p.ProduceAsync(ctx, streams.Record{Stream: topic, Key: keys[n%int64(len(keys))], EventType: "bench", Data: payload}, done)
		n++
	}
	if err := p.Flush(ctx); err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(t0)
	if err := p.Close(context.WithoutCancel(ctx)); err != nil {
		return 0, 0, err
	}
	return n, elapsed, failed
}
