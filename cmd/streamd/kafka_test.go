package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// streamd serve --kafka-addr serves Kafka clients; a record produced over Kafka is
// fetched by `streamd fetch`; serve stops cleanly with a Kafka consumer connected.
func TestServeKafka(t *testing.T) {
	t.Parallel()
	ctx, cancelCtx := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelCtx()
	kafkaAddr := freeAddr(t)
	_, cancel, done := serveInProcess(t, "--auth-disabled", "--kafka-addr", kafkaAddr)
	defer cancel()

	topic := testdb.Name("serve-kafka")
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ConsumeTopics(topic), kgo.FetchMaxWait(time.Second))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	require.Eventually(t, func() bool {
		_, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "serve's Kafka listener comes up")
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("from kafka"),
		Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}}).FirstErr())

	out, err := run(t, ctx, "", "fetch", topic, "--partition", "0")
	require.NoError(t, err)
	var ev streams.Event
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &ev))
	require.Equal(t, []byte("from kafka"), ev.Bytes)
	require.Equal(t, "k", ev.Key)
	require.Equal(t, []streams.Header{{Key: "h", Value: []byte("v")}}, ev.RawHeaders)

	fs := cl.PollFetches(ctx)
	require.NoError(t, fs.Err())
	require.Equal(t, "from kafka", string(fs.Records()[0].Value))
	go cl.PollFetches(ctx) // a long poll in flight while serve stops
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestServeKafkaConfigErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--auth-disabled", "--kafka-addr", "0.0.0.0:9092"}, "loopback"},
		{[]string{"serve", "--auth-disabled", "--kafka-addr", "192.0.2.1:9092"}, "--auth-disabled"},
		{[]string{"serve", "--auth-disabled", "--kafka-addr", ":9092"}, "loopback"},
		{[]string{"serve", "--auth-disabled", "--kafka-addr", "nonsense"}, "--kafka-addr"},
		{[]string{"serve", "--auth-disabled", "--kafka-auto-create-topics"}, "need --kafka-addr"},
		{[]string{"serve", "--auth-disabled", "--kafka-sasl-oauthbearer-unsecured"}, "need --kafka-addr"},
		{[]string{"serve", "--auth-disabled", "--kafka-addr", "127.0.0.1:9092", "--kafka-sasl-oauthbearer-unsecured"}, "--auth-disabled turns off"},
		{[]string{"serve", "--auth-token", "tok-0123456789abcdef", "--kafka-addr", "0.0.0.0:9092", "--kafka-sasl-oauthbearer-unsecured"}, "any principal"},
		{[]string{"serve", "--auth-token", "tok-0123456789abcdef", "--kafka-addr", "127.0.0.1:9092", "--kafka-sasl-oauthbearer-unsecured-required-scope", "x"}, "need --kafka-sasl-oauthbearer-unsecured"},
	} {
		_, err := run(t, ctx, "", tc.args...)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}
