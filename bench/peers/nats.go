package main

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsSystem is NATS JetStream: one file-storage stream per topic with one subject;
// producers publish (synchronously for batches of 1, else PublishAsync and wait for
// every ack); the consumer is a durable pull consumer (AckAll, acked every 250
// messages and at the end) read with Messages().
type natsSystem struct {
	url     string
	version string
	nc      *nats.Conn
	js      jetstream.JetStream
}

func newNATS(url, version string) (*natsSystem, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsSystem{url: url, version: version, nc: nc, js: js}, nil
}

func (s *natsSystem) name() string { return "nats-jetstream" }

func (s *natsSystem) durability() string {
	return s.version + ", file storage; no fsync per message (this version has no sync_interval: always), so an ack means written to the OS, not flushed to disk"
}

func (s *natsSystem) newTopic(ctx context.Context, topic string) error {
	_, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: topic, Subjects: []string{topic}, Storage: jetstream.FileStorage})
	return err
}

func (s *natsSystem) dropTopic(ctx context.Context, topic string) error {
	return s.js.DeleteStream(ctx, topic)
}

type natsProducer struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	topic string
}

func (s *natsSystem) newProducer(_ context.Context, topic string, _, _ int) (producer, error) {
	nc, err := nats.Connect(s.url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsProducer{nc: nc, js: js, topic: topic}, nil
}

func (p *natsProducer) send(ctx context.Context, payloads [][]byte) error {
	if len(payloads) == 1 {
		_, err := p.js.Publish(ctx, p.topic, payloads[0])
		return err
	}
	futures := make([]jetstream.PubAckFuture, len(payloads))
	for i, d := range payloads {
		f, err := p.js.PublishAsync(p.topic, d)
		if err != nil {
			return err
		}
		futures[i] = f
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("nats publish: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (p *natsProducer) close() { p.nc.Close() }

func (s *natsSystem) consume(ctx context.Context, topic, group string, ready func(), deliver func([]byte)) error {
	cons, err := s.js.CreateOrUpdateConsumer(ctx, topic, jetstream.ConsumerConfig{
		Durable:       group,
		AckPolicy:     jetstream.AckAllPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 10000,
	})
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1000))
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	go func() { // owner: consume; exits when ctx ends or consume returns
		select {
		case <-ctx.Done():
			it.Stop()
		case <-stopped:
		}
	}()
	defer close(stopped)
	defer it.Stop()
	ready()
	n := 0
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("nats consume: %w", err)
		}
		deliver(m.Data())
		n++
		if n%250 == 0 {
			_ = m.Ack()
		}
	}
}

func (s *natsSystem) close() { s.nc.Close() }
