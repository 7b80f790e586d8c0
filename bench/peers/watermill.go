package main

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// watermillSystem is Watermill's SQL Pub/Sub with its PostgreSQL schema adapter
// (DefaultPostgreSQLSchema: one table per topic, a multi-row INSERT per Publish call;
// DefaultPostgreSQLOffsetsAdapter: one offset row per consumer group) on streamd's
// PostgreSQL, through database/sql and pgx's stdlib driver.
type watermillSystem struct {
	db *stdsql.DB
	// pollInterval is the subscriber's wait after a query found nothing.
	pollInterval time.Duration
	// batch is the subscriber's rows per query (SubscribeBatchSize).
	batch int
}

func newWatermill(url string, pollInterval time.Duration, batch int) (*watermillSystem, error) {
	db, err := stdsql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(16)
	return &watermillSystem{db: db, pollInterval: pollInterval, batch: batch}, nil
}

func (s *watermillSystem) name() string { return "watermill-sql" }

func (s *watermillSystem) durability() string {
	return "commit = PostgreSQL transaction commit on the same server as streamd (same synchronous_commit and fsync)"
}

func (s *watermillSystem) schema() wsql.DefaultPostgreSQLSchema {
	return wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: s.batch}
}

func (s *watermillSystem) newTopic(ctx context.Context, topic string) error {
	for _, q := range s.schema().SchemaInitializingQueries(topic) {
		if _, err := s.db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("create watermill topic %s: %w", topic, err)
		}
	}
	return nil
}

func (s *watermillSystem) dropTopic(ctx context.Context, topic string) error {
	for _, t := range []string{"watermill_" + topic, "watermill_offsets_" + topic} {
		if _, err := s.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{t}.Sanitize()); err != nil {
			return err
		}
	}
	return nil
}

type watermillProducer struct {
	pub   *wsql.Publisher
	topic string
}

func (s *watermillSystem) newProducer(_ context.Context, topic string, _, _ int) (producer, error) {
	pub, err := wsql.NewPublisher(s.db, wsql.PublisherConfig{SchemaAdapter: s.schema()}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	return &watermillProducer{pub: pub, topic: topic}, nil
}

func (p *watermillProducer) send(_ context.Context, payloads [][]byte) error {
	msgs := make([]*message.Message, len(payloads))
	for i, d := range payloads {
		msgs[i] = message.NewMessage(watermill.NewUUID(), d)
	}
	return p.pub.Publish(p.topic, msgs...)
}

func (p *watermillProducer) close() { _ = p.pub.Close() }

func (s *watermillSystem) consume(ctx context.Context, topic, group string, ready func(), deliver func([]byte)) error {
	sub, err := wsql.NewSubscriber(s.db, wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    s.schema(),
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     s.pollInterval,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	ready()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			deliver(m.Payload)
			m.Ack()
		}
	}
}

func (s *watermillSystem) close() { _ = s.db.Close() }
