package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
)

// system is one messaging system under test: streamd or a peer. Each case uses a
// fresh topic (stream, table, subject or key) that the case removes afterwards.
type system interface {
	// name is the label in the table ("streamd", "nats-jetstream", ...).
	name() string
	// durability says when a write is acknowledged, in the figures' terms.
	durability() string
	// newTopic creates an empty topic.
	newTopic(ctx context.Context, topic string) error
	// dropTopic removes a topic and its consumer state.
	dropTopic(ctx context.Context, topic string) error
	// newProducer returns producer w of workers writing to topic.
	newProducer(ctx context.Context, topic string, w, workers int) (producer, error)
	// consume reads topic from its start in consumer group group until ctx ends,
	// calling ready once the consumer is in place and deliver for every message
	// (possibly from several goroutines). It acknowledges or commits in batches as
	// the system's consumer does by default. It returns nil when ctx ended.
	consume(ctx context.Context, topic, group string, ready func(), deliver func(payload []byte)) error
	close()
}

// producer sends batches to one topic from one goroutine.
type producer interface {
	// send writes the payloads as one batch and returns when the system
	// acknowledged all of them.
	send(ctx context.Context, payloads [][]byte) error
	close()
}

// payloadSize is the size of every message's payload (a JSON object).
const payloadSize = 1024

// makePayload returns a payloadSize-byte JSON object carrying the send time t (unix
// nanoseconds) in its first field, so that a consumer can compute the latency.
func makePayload(t int64) []byte {
	b := make([]byte, 0, payloadSize)
	b = append(b, `{"t":`...)
	b = strconv.AppendInt(b, t, 10)
	b = append(b, `,"p":"`...)
	for len(b) < payloadSize-2 {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
}

// payloadTime returns the send time in a payload made by makePayload. It looks the
// field up rather than expecting it first, because a jsonb column (streamd's) returns
// the object with its keys reordered and a space after each colon.
func payloadTime(p []byte) (int64, error) {
	i := bytes.Index(p, []byte(`"t":`))
	if i < 0 {
		return 0, fmt.Errorf("payload without a time: %.40q", p)
	}
	var t int64
	for _, c := range bytes.TrimLeft(p[i+4:], " ") {
		if c < '0' || c > '9' {
			break
		}
		t = t*10 + int64(c-'0')
	}
	return t, nil
}
