package streamconfig_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

func setup(t *testing.T) (*streamconfig.Store, *streams.Client, string) {
	t.Helper()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	name := testdb.Name("cfg")
	require.NoError(t, c.CreateStream(context.Background(), name, 2))
	return streamconfig.NewStore(pool), c, name
}

func TestDurationForms(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		`"90.00:00:00"`:  90 * 24 * time.Hour,
		`"01:30:00"`:     90 * time.Minute,
		`"1.02:03:04.5"`: 26*time.Hour + 3*time.Minute + 4500*time.Millisecond,
		`"2160h"`:        2160 * time.Hour,
		`"1h30m"`:        90 * time.Minute,
		`86400`:          24 * time.Hour,
		`"00:00:00"`:     0,
		`"100.02:48:05"`: 100*24*time.Hour + 2*time.Hour + 48*time.Minute + 5*time.Second,
	} {
		var d streamconfig.Duration
		require.NoError(t, json.Unmarshal([]byte(in), &d), in)
		require.Equal(t, want, time.Duration(d), in)
	}
	for _, in := range []string{`"90"`, `"24:00:00"`, `"00:60:00"`, `"soon"`, `-1`, `true`, `"1.2.3"`, `"106752.00:00:00"`} {
		var d streamconfig.Duration
		require.Error(t, json.Unmarshal([]byte(in), &d), in)
	}
	b, err := json.Marshal(streamconfig.Duration(90 * 24 * time.Hour))
	require.NoError(t, err)
	require.Equal(t, `"90.00:00:00"`, string(b))
	b, err = json.Marshal(streamconfig.Duration(90 * time.Minute))
	require.NoError(t, err)
	require.Equal(t, `"01:30:00"`, string(b))
}

// The seed's JSON forms and Go durations decode into the typed configuration, Set
// stores it, Get returns it, and retention_policies (what retention runs) agrees.
func TestSetGetAndPolicyMirror(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c, name := setup(t)
	var cfg streamconfig.Config
	require.NoError(t, json.Unmarshal([]byte(`{
		"retention_config": {"maxAge": "90.00:00:00", "maxSizeBytes": 10737418240, "maxEventCount": 5000, "protectConsumers": true},
		"performance_config": {"batchSize": 1000, "enableCompression": true},
		"dead_letter_config": {"enabled": true, "maxDeliveryAttempts": 5, "stream": "orders.dlq"},
		"lifecycle_config": {"archiveAfter": "720h"},
		"access_control_config": {"readers": ["analytics"], "writers": ["orders_svc"]},
		"tags": {"team": "payments"}}`), &cfg))
	require.NoError(t, s.Set(ctx, name, &cfg))

	got, err := s.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, 90*24*time.Hour, time.Duration(*got.Retention.MaxAge))
	require.Equal(t, int64(10737418240), *got.Retention.MaxSizeBytes)
	require.Equal(t, int64(5000), *got.Retention.MaxEventCount)
	require.True(t, got.Retention.ProtectConsumers)
	require.Equal(t, streamconfig.CleanupDelete, got.Retention.CleanupPolicy, "defaults are filled in")
	require.Equal(t, 1000, got.Performance.BatchSize)
	require.Equal(t, "orders.dlq", got.DeadLetter.Stream)
	require.Equal(t, 720*time.Hour, time.Duration(*got.Lifecycle.ArchiveAfter))
	require.Equal(t, []string{"analytics"}, got.AccessControl.Readers)
	require.Equal(t, map[string]string{"team": "payments"}, got.Tags)

	var age, count int32
	var size int64
	var protect bool
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT max_age_seconds, max_event_count, max_size_bytes, protect_consumers
		FROM streamd.retention_policies WHERE stream_name = $1`, name).Scan(&age, &count, &size, &protect))
	require.Equal(t, [4]any{int32(90 * 86400), int32(5000), int64(10737418240), true}, [4]any{age, count, size, protect})

	// A seed-style SQL write of the policy shows in the configuration.
	_, err = c.Pool().Exec(ctx, `UPDATE streamd.retention_policies SET max_age_seconds = 3600, enabled = false WHERE stream_name = $1`, name)
	require.NoError(t, err)
	got, err = s.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, time.Hour, time.Duration(*got.Retention.MaxAge))
	require.False(t, *got.Retention.Enabled)
	require.Equal(t, 1000, got.Performance.BatchSize, "other sections untouched")

	// Removing the retention section removes the policy, and the reverse.
	got.Retention = nil
	require.NoError(t, s.Set(ctx, name, got))
	var n int
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT count(*) FROM streamd.retention_policies WHERE stream_name = $1`, name).Scan(&n))
	require.Zero(t, n)
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.retention_policies (stream_name, max_event_count) VALUES ($1, 7)`, name)
	require.NoError(t, err)
	got, err = s.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, int64(7), *got.Retention.MaxEventCount)
	_, err = c.Pool().Exec(ctx, `DELETE FROM streamd.retention_policies WHERE stream_name = $1`, name)
	require.NoError(t, err)
	got, err = s.Get(ctx, name)
	require.NoError(t, err)
	require.Nil(t, got.Retention)

	// Deleting the stream deletes both.
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.retention_policies (stream_name, max_event_count) VALUES ($1, 7)`, name)
	require.NoError(t, err)
	require.NoError(t, c.DeleteStream(ctx, name))
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM streamd.retention_policies WHERE stream_name = $1)
		+ (SELECT count(*) FROM streamd.stream_configurations WHERE stream_name = $1)`, name).Scan(&n))
	require.Zero(t, n)
	_, err = s.Get(ctx, name)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
}

// Bad configuration is refused with ErrInvalidConfig naming the field, from Go and
// from SQL, and nothing is written.
func TestInvalidConfigNamesTheFieldAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c, name := setup(t)
	count := int64(10)
	require.NoError(t, s.Set(ctx, name, &streamconfig.Config{Retention: &streamconfig.Retention{MaxEventCount: &count}}))

	neg := int64(-1)
	zero := streamconfig.Duration(0)
	half := streamconfig.Duration(500 * time.Millisecond)
	oneAndHalf := streamconfig.Duration(1500 * time.Millisecond)
	for field, cfg := range map[string]*streamconfig.Config{
		// Fractions of a second were cut off when stored (500ms became 0).
		"lifecycle_config.archiveAfter":          {Lifecycle: &streamconfig.Lifecycle{ArchiveAfter: &half}},
		"retention_config.tombstoneRetention":    {Retention: &streamconfig.Retention{TombstoneRetention: &half}},
		"retention_config.maxAge#fraction":       {Retention: &streamconfig.Retention{MaxAge: &oneAndHalf}},
		"retention_config.maxEventCount":         {Retention: &streamconfig.Retention{MaxEventCount: &neg}},
		"retention_config.maxSizeBytes":          {Retention: &streamconfig.Retention{MaxSizeBytes: &neg}},
		"retention_config.maxAge":                {Retention: &streamconfig.Retention{MaxAge: &zero}},
		"retention_config.cleanupPolicy":         {Retention: &streamconfig.Retention{CleanupPolicy: "shred"}},
		"dead_letter_config.maxDeliveryAttempts": {DeadLetter: &streamconfig.DeadLetter{MaxDeliveryAttempts: -2}},
		"dead_letter_config.stream":              {DeadLetter: &streamconfig.DeadLetter{Stream: "bad name!"}},
		"performance_config.batchSize":           {Performance: &streamconfig.Performance{BatchSize: 1 << 20}},
		"lifecycle_config.deleteAfter":           {Lifecycle: &streamconfig.Lifecycle{DeleteAfter: &zero}},
		"access_control_config.readers[0]":       {AccessControl: &streamconfig.AccessControl{Readers: []string{""}}},
	} {
		err := s.Set(ctx, name, cfg)
		require.ErrorIs(t, err, streamconfig.ErrInvalidConfig, field)
		var fe *streamconfig.FieldError
		require.ErrorAs(t, err, &fe, field)
		require.Equal(t, strings.Split(field, "#")[0], fe.Field)
	}
	got, err := s.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, int64(10), *got.Retention.MaxEventCount, "nothing written")

	// From SQL, the trigger validates retention_config and names the key.
	for key, js := range map[string]string{
		"maxAge":        `{"maxAge": "ninety days"}`,
		"maxEventCount": `{"maxEventCount": -3}`,
		"maxSizeBytes":  `{"maxSizeBytes": "big"}`,
		"cleanupPolicy": `{"cleanupPolicy": "shred"}`,
		"maxAgee":       `{"maxAgee": "01:00:00"}`,
		"enabled":       `{"enabled": "yes"}`,
	} {
		_, err := c.Pool().Exec(ctx, `UPDATE streamd.stream_configurations SET retention_config = $2::jsonb WHERE stream_name = $1`, name, js)
		err = sqlerr.Wrap(err)
		require.ErrorIs(t, err, streamconfig.ErrInvalidConfig, js)
		require.ErrorContains(t, err, "retention_config."+key, js)
	}
	err = s.Set(ctx, "no-such-"+name, &streamconfig.Config{})
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	var policyCount int64
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT max_event_count FROM streamd.retention_policies WHERE stream_name = $1`, name).Scan(&policyCount))
	require.Equal(t, int64(10), policyCount)
	require.False(t, errors.Is(err, streamconfig.ErrInvalidConfig))
}
