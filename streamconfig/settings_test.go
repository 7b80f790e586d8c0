package streamconfig_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// The dead-letter, lifecycle and performance sections have defined keys: from plain
// SQL an unknown key, a wrong type or an out-of-range value is refused with SD301
// naming the key (the seed's {"foo": 1} too), and nothing is written; the defined
// keys are accepted; from Go, a bad field is a *FieldError naming it.
func TestSettingsKeysAreChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, c, name := setup(t)
	for _, tc := range []struct{ column, value, names string }{
		{"performance_config", `{"foo": 1}`, "performance_config.foo"},
		{"dead_letter_config", `{"foo": 1}`, "dead_letter_config.foo"},
		{"lifecycle_config", `{"foo": 1}`, "lifecycle_config.foo"},
		{"performance_config", `{"batchSize": "1000"}`, "performance_config.batchSize"},
		{"performance_config", `{"batchSize": 0}`, "performance_config.batchSize"},
		{"performance_config", `{"batchSize": 1.5}`, "performance_config.batchSize"},
		{"performance_config", `{"enableCompression": "yes"}`, "performance_config.enableCompression"},
		{"performance_config", `{"enableCompression": true, "compressionCodec": "brotli"}`, "performance_config.compressionCodec"},
		{"performance_config", `{"enableCompression": true, "compressionCodec": 4}`, "performance_config.compressionCodec"},
		{"performance_config", `{"compressionCodec": "zstd"}`, "performance_config.compressionCodec"},
		{"performance_config", `{"enableCompression": false, "compressionCodec": "zstd"}`, "performance_config.compressionCodec"},
		{"dead_letter_config", `{"maxDeliveryAttempts": 1001}`, "dead_letter_config.maxDeliveryAttempts"},
		{"dead_letter_config", `{"enabled": 1}`, "dead_letter_config.enabled"},
		{"dead_letter_config", `{"stream": "no spaces"}`, "dead_letter_config.stream"},
		{"dead_letter_config", `{"backoff": "soon"}`, "dead_letter_config.backoff"},
		{"dead_letter_config", `{"backoff": "500ms"}`, "dead_letter_config.backoff"},
		{"lifecycle_config", `{"readOnly": "true"}`, "lifecycle_config.readOnly"},
		{"lifecycle_config", `{"archiveAfter": true}`, "lifecycle_config.archiveAfter"},
		{"lifecycle_config", `{"deleteAfter": 0}`, "lifecycle_config"},
	} {
		_, err := c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, `+tc.column+`) VALUES ($1, $2::jsonb)`, name, tc.value)
		require.Equal(t, sqlerr.InvalidStreamConfig, sqlerr.Code(err), "%s %s: %v", tc.column, tc.value, err)
		require.ErrorContains(t, err, tc.names)
		require.ErrorIs(t, sqlerr.Wrap(err), streamconfig.ErrInvalidConfig)
	}
	var n int
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT count(*) FROM streamd.stream_configurations WHERE stream_name = $1", name).Scan(&n))
	require.Zero(t, n, "nothing written")

	// The seed's example and every defined key.
	_, err := c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, performance_config, dead_letter_config, lifecycle_config)
		VALUES ($1, '{"batchSize": 1000, "enableCompression": true}',
		        '{"enabled": true, "maxDeliveryAttempts": 3, "stream": "orders-dlq", "backoff": "00:00:30"}',
		        '{"readOnly": false, "archiveAfter": "30.00:00:00", "deleteAfter": 7776000}')`, name)
	require.NoError(t, err)
	cfg, err := store.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, 1000, cfg.Performance.BatchSize)
	require.True(t, *cfg.Performance.EnableCompression)
	_, err = c.Pool().Exec(ctx, `UPDATE streamd.stream_configurations
		SET performance_config = '{"enableCompression": true, "compressionCodec": "zstd"}' WHERE stream_name = $1`, name)
	require.NoError(t, err)
	cfg, err = store.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, "zstd", cfg.Performance.CompressionCodec)
	require.Equal(t, 3, cfg.DeadLetter.MaxDeliveryAttempts)
	require.Equal(t, 30*time.Second, time.Duration(*cfg.DeadLetter.Backoff))

	// Go: the same rules, naming the field.
	half := streamconfig.Duration(1500 * time.Millisecond)
	err = store.Set(ctx, name, &streamconfig.Config{DeadLetter: &streamconfig.DeadLetter{Backoff: &half}})
	var fe *streamconfig.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "dead_letter_config.backoff", fe.Field)
	on := true
	err = store.Set(ctx, name, &streamconfig.Config{Performance: &streamconfig.Performance{EnableCompression: &on, CompressionCodec: "brotli"}})
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "performance_config.compressionCodec", fe.Field)
	err = store.Set(ctx, name, &streamconfig.Config{Performance: &streamconfig.Performance{CompressionCodec: "gzip"}})
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "performance_config.compressionCodec", fe.Field)
	// A JSON door that decodes into Config (the CLI) refuses unknown keys.
	dec := json.NewDecoder(jsonReader(`{"performance_config": {"foo": 1}}`))
	dec.DisallowUnknownFields()
	require.Error(t, dec.Decode(&streamconfig.Config{}))
}

// lifecycle_config.readOnly acts: every append path refuses the stream's appends
// (streams.ErrInvalidArgument, nothing written) until it is cleared.
func TestReadOnlyStreamRefusesAppends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, c, name := setup(t)
	require.NoError(t, store.Set(ctx, name, &streamconfig.Config{Lifecycle: &streamconfig.Lifecycle{ReadOnly: true}}))
	batch := make([]streams.Record, 40) // 32 or more to one partition: the COPY path
	for i := range batch {
		batch[i] = streams.Record{Stream: name, Partition: streams.PartitionOf(0), Data: json.RawMessage(`{}`)}
	}
	_, err := c.Produce(ctx, batch...)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	require.ErrorContains(t, err, "read-only")
	_, err = c.Produce(ctx, streams.Record{Stream: name, Data: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.events (stream_name, data) VALUES ($1, '{}')`, name)
	require.ErrorIs(t, sqlerr.Wrap(err), streams.ErrInvalidArgument)
	var n int
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", name).Scan(&n))
	require.Zero(t, n)

	// Cleared from plain SQL: appends go through again.
	_, err = c.Pool().Exec(ctx, `UPDATE streamd.stream_configurations SET lifecycle_config = '{"readOnly": false}' WHERE stream_name = $1`, name)
	require.NoError(t, err)
	_, err = c.Produce(ctx, batch...)
	require.NoError(t, err)
}

func jsonReader(s string) *strings.Reader { return strings.NewReader(s) }

// lifecycle_config.archiveAfter and deleteAfter act when ApplyLifecycle (the
// coordinator leader's job) runs: a stream idle for its deleteAfter is deleted, one
// idle for its archiveAfter becomes read-only (and is not archived twice), one not
// yet idle long enough is left alone.
func TestApplyLifecycle(t *testing.T) {
	// Not parallel: a pass applies every stream's lifecycle, so two tests' passes at
	// a later time archive and delete each other's streams (TestApplyLifecycle and
	// TestApplyLifecycleSkipsAnUnparseableValue each failed so, 5 runs in 40).
	ctx := context.Background()
	store, c, archived := setup(t)
	_, _, deleted := setup(t)
	_, _, kept := setup(t)
	minute := streamconfig.Duration(time.Minute)
	day := streamconfig.Duration(24 * time.Hour)
	require.NoError(t, store.Set(ctx, archived, &streamconfig.Config{Lifecycle: &streamconfig.Lifecycle{ArchiveAfter: &minute}}))
	require.NoError(t, store.Set(ctx, deleted, &streamconfig.Config{Lifecycle: &streamconfig.Lifecycle{DeleteAfter: &minute, ArchiveAfter: &minute}}))
	require.NoError(t, store.Set(ctx, kept, &streamconfig.Config{Lifecycle: &streamconfig.Lifecycle{ArchiveAfter: &day}}))
	_, err := c.Produce(ctx, streams.Record{Stream: archived, Data: json.RawMessage(`{}`)})
	require.NoError(t, err)

	res, err := streamconfig.ApplyLifecycle(ctx, c.Pool(), time.Time{})
	require.NoError(t, err)
	require.NotContains(t, res.Archived, archived, "not idle yet")
	require.NotContains(t, res.Deleted, deleted)

	later := time.Now().Add(2 * time.Minute)
	res, err = streamconfig.ApplyLifecycle(ctx, c.Pool(), later)
	require.NoError(t, err)
	require.Contains(t, res.Archived, archived)
	require.Contains(t, res.Deleted, deleted)
	require.NotContains(t, res.Archived, kept)
	require.NotContains(t, res.Deleted, kept)
	_, err = c.DescribeStream(ctx, deleted)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	_, err = c.Produce(ctx, streams.Record{Stream: archived, Data: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, streams.ErrInvalidArgument, "an archived stream is read-only")
	cfg, err := store.Get(ctx, archived)
	require.NoError(t, err)
	require.True(t, cfg.Lifecycle.ReadOnly)
	_, err = c.Produce(ctx, streams.Record{Stream: kept, Data: json.RawMessage(`{}`)})
	require.NoError(t, err)

	res, err = streamconfig.ApplyLifecycle(ctx, c.Pool(), later)
	require.NoError(t, err)
	require.NotContains(t, res.Archived, archived, "archived once")
}
