package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisSystem is Redis Streams: one stream key per topic; producers XADD (a pipeline
// of XADDs per batch); the consumer is one member of a consumer group reading with
// XREADGROUP COUNT 500 BLOCK and acknowledging each batch with one XACK.
type redisSystem struct {
	version string
	rdb     *redis.Client
}

func newRedis(addr, version string) *redisSystem {
	return &redisSystem{version: version, rdb: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 16})}
}

func (s *redisSystem) name() string { return "redis-streams" }

func (s *redisSystem) durability() string {
	return s.version + ", appendonly yes, appendfsync always (AOF fsynced before replies, once per event-loop pass)"
}

func (s *redisSystem) newTopic(context.Context, string) error { return nil }

func (s *redisSystem) dropTopic(ctx context.Context, topic string) error {
	return s.rdb.Del(ctx, topic).Err()
}

type redisProducer struct {
	rdb   *redis.Client
	topic string
}

func (s *redisSystem) newProducer(_ context.Context, topic string, _, _ int) (producer, error) {
	return &redisProducer{rdb: s.rdb, topic: topic}, nil
}

func (p *redisProducer) send(ctx context.Context, payloads [][]byte) error {
	if len(payloads) == 1 {
		return p.rdb.XAdd(ctx, &redis.XAddArgs{Stream: p.topic, Values: []any{"d", payloads[0]}}).Err()
	}
	_, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, d := range payloads {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: p.topic, Values: []any{"d", d}})
		}
		return nil
	})
	return err
}

func (p *redisProducer) close() {}

func (s *redisSystem) consume(ctx context.Context, topic, group string, ready func(), deliver func([]byte)) error {
	err := s.rdb.XGroupCreateMkStream(ctx, topic, group, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") { // redis reports it only as text
		return fmt.Errorf("xgroup create: %w", err)
	}
	ready()
	for ctx.Err() == nil {
		res, err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{topic, ">"}, Count: 500, Block: 200 * time.Millisecond}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("xreadgroup: %w", err)
		}
		for _, st := range res {
			ids := make([]string, len(st.Messages))
			for i, m := range st.Messages {
				if d, ok := m.Values["d"].(string); ok {
					deliver([]byte(d))
				}
				ids[i] = m.ID
			}
			if len(ids) > 0 {
				if err := s.rdb.XAck(ctx, topic, group, ids...).Err(); err != nil && ctx.Err() == nil {
					return fmt.Errorf("xack: %w", err)
				}
			}
		}
	}
	return nil
}

func (s *redisSystem) close() { _ = s.rdb.Close() }
