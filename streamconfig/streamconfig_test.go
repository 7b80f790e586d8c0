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

// policyOf returns stream's max_event_count in retention_policies (-1 when it has no
// policy) and its retention_config.
func policyOf(t *testing.T, c *streams.Client, stream string) (int64, string) {
	t.Helper()
	var count int64
	var cfg *string
	require.NoError(t, c.Pool().QueryRow(context.Background(), `
		SELECT coalesce((SELECT coalesce(max_event_count, -2) FROM streamd.retention_policies WHERE stream_name = $1), -1),
		       (SELECT retention_config::text FROM streamd.stream_configurations WHERE stream_name = $1)`, stream).Scan(&count, &cfg))
	if cfg == nil {
		return count, ""
	}
	return count, *cfg
}

// An upsert of other columns (ON CONFLICT DO UPDATE SET tags = ...) leaves the policy
// alone. The policy was written in a BEFORE INSERT trigger, which fires before the
// conflict check and saw the INSERT's NULL retention_config: it deleted the policy
// while retention_config still showed it.
func TestUpsertOfOtherColumnsKeepsThePolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, c, name := setup(t)
	_, err := c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, retention_config) VALUES ($1, '{"maxEventCount": 5}')`, name)
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, tags) VALUES ($1, '{"team": "x"}')
		ON CONFLICT (stream_name) DO UPDATE SET tags = EXCLUDED.tags`, name)
	require.NoError(t, err)
	count, cfg := policyOf(t, c, name)
	require.Equal(t, int64(5), count, "the policy survives the upsert")
	require.Contains(t, cfg, `"maxEventCount": 5`)

	// An upsert that does set retention_config writes the policy once, from the row
	// as stored.
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, retention_config) VALUES ($1, '{"maxEventCount": 2}')
		ON CONFLICT (stream_name) DO UPDATE SET retention_config = EXCLUDED.retention_config`, name)
	require.NoError(t, err)
	count, cfg = policyOf(t, c, name)
	require.Equal(t, int64(2), count)
	require.Contains(t, cfg, `"maxEventCount": 2`)
}

// INSERT ... ON CONFLICT DO NOTHING on a stream that has a configuration changes
// nothing. The BEFORE INSERT trigger rewrote the policy to the refused row's values
// (1) while retention_config kept showing 5.
func TestInsertOnConflictDoNothingLeavesThePolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, c, name := setup(t)
	_, err := c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, retention_config) VALUES ($1, '{"maxEventCount": 5}')`, name)
	require.NoError(t, err)
	tag, err := c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, retention_config) VALUES ($1, '{"maxEventCount": 1}')
		ON CONFLICT DO NOTHING`, name)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected())
	count, cfg := policyOf(t, c, name)
	require.Equal(t, int64(5), count, "the policy is what the stored configuration says")
	require.Contains(t, cfg, `"maxEventCount": 5`)

	// Same for a configuration that has no retention section yet.
	other := testdb.Name("cfg")
	require.NoError(t, c.CreateStream(ctx, other, 1))
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, tags) VALUES ($1, '{"a": "b"}')`, other)
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, retention_config) VALUES ($1, '{"maxEventCount": 1}')
		ON CONFLICT DO NOTHING`, other)
	require.NoError(t, err)
	count, cfg = policyOf(t, c, other)
	require.Equal(t, int64(-1), count, "no policy")
	require.Empty(t, cfg)
}

// sqlSetRetention writes retention_config from SQL and returns the mapped error.
func sqlSetRetention(c *streams.Client, stream, js string) error {
	_, err := c.Pool().Exec(context.Background(), `UPDATE streamd.stream_configurations SET retention_config = $2::jsonb WHERE stream_name = $1`, stream, js)
	return sqlerr.Wrap(err)
}

// Numbers out of range in retention_config written from SQL are SD301
// (ErrInvalidConfig) naming the key, and nothing is written. They failed with
// PostgreSQL's 22003 (bigint out of range), untyped. An integral 5.0 is 5, as it is
// for a number of seconds in Go: it failed with 22P02, which read as
// streams.ErrInvalidJSON.
func TestSQLRetentionConfigOutOfRangeNamesTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c, name := setup(t)
	count := int64(10)
	require.NoError(t, s.Set(ctx, name, &streamconfig.Config{Retention: &streamconfig.Retention{MaxEventCount: &count}}))

	for _, tc := range []struct{ key, js string }{
		{"maxAge", `{"maxAge": 1e30}`},
		{"maxAge", `{"maxAge": "99999999999999999999h"}`},
		{"maxAge", `{"maxAge": "99999999999999999999.00:00:00"}`},
		{"maxAge", `{"maxAge": 2147483648}`},
		{"tombstoneRetention", `{"tombstoneRetention": "99999999999999999999.00:00:00"}`},
		{"tombstoneRetention", `{"tombstoneRetention": 1e30}`},
		{"tombstoneRetention", `{"tombstoneRetention": "99999999999999999999h"}`},
		{"maxEventCount", `{"maxEventCount": 1e30}`},
		{"maxSizeBytes", `{"maxSizeBytes": 1e30}`},
	} {
		err := sqlSetRetention(c, name, tc.js)
		require.ErrorIs(t, err, streamconfig.ErrInvalidConfig, tc.js)
		require.ErrorContains(t, err, "retention_config."+tc.key, tc.js)
	}
	got, err := s.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, int64(10), *got.Retention.MaxEventCount, "nothing written")
	n, _ := policyOf(t, c, name)
	require.Equal(t, int64(10), n, "nothing written")

	require.NoError(t, sqlSetRetention(c, name, `{"maxEventCount": 5.0, "maxSizeBytes": 100.0, "maxAge": 3600.0}`))
	got, err = s.Get(ctx, name)
	require.NoError(t, err, "stored in the canonical form, which Go reads")
	require.Equal(t, int64(5), *got.Retention.MaxEventCount)
	require.Equal(t, int64(100), *got.Retention.MaxSizeBytes)
	require.Equal(t, time.Hour, time.Duration(*got.Retention.MaxAge))
	n, _ = policyOf(t, c, name)
	require.Equal(t, int64(5), n)
}

// A duration with a fraction of a second in retention_config written from SQL is
// refused (SD301 naming the key), as Go's Validate refuses it; it was cut off, and a
// "500ms" tombstoneRetention was stored as "00:00:00". A zero tombstoneRetention
// (drop tombstones at the next pass) is accepted by both.
func TestSQLRetentionConfigRefusesFractionsOfASecond(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c, name := setup(t)
	count := int64(10)
	require.NoError(t, s.Set(ctx, name, &streamconfig.Config{Retention: &streamconfig.Retention{MaxEventCount: &count}}))

	for _, tc := range []struct{ key, js string }{
		{"tombstoneRetention", `{"tombstoneRetention": "500ms"}`},
		{"tombstoneRetention", `{"tombstoneRetention": "00:00:00.5"}`},
		{"tombstoneRetention", `{"tombstoneRetention": 0.5}`},
		{"maxAge", `{"maxAge": "1h0.5s"}`},
		{"maxAge", `{"maxAge": "1.02:03:04.5"}`},
		{"maxAge", `{"maxAge": "1500ms"}`},
		{"maxAge", `{"maxAge": 1.5}`},
	} {
		err := sqlSetRetention(c, name, tc.js)
		require.ErrorIs(t, err, streamconfig.ErrInvalidConfig, tc.js)
		require.ErrorContains(t, err, "retention_config."+tc.key+": ", tc.js)
		require.ErrorContains(t, err, "must be a whole number of seconds", tc.js)

		// Go refuses the same JSON the same way.
		var r streamconfig.Retention
		require.NoError(t, json.Unmarshal([]byte(tc.js), &r), tc.js)
		var fe *streamconfig.FieldError
		require.ErrorAs(t, (&streamconfig.Config{Retention: &r}).Validate(), &fe, tc.js)
		require.Equal(t, "retention_config."+tc.key, fe.Field, tc.js)
	}
	n, cfg := policyOf(t, c, name)
	require.Equal(t, int64(10), n, "nothing written")
	require.Contains(t, cfg, `"maxEventCount": 10`)

	// Whole seconds written with a fraction part are whole seconds.
	require.NoError(t, sqlSetRetention(c, name, `{"maxAge": "1000ms", "tombstoneRetention": "00:00:02.000"}`))
	got, err := s.Get(ctx, name)
	require.NoError(t, err)
	require.Equal(t, time.Second, time.Duration(*got.Retention.MaxAge))
	require.Equal(t, 2*time.Second, time.Duration(*got.Retention.TombstoneRetention))

	// Zero tombstone retention: accepted from SQL and from Go.
	require.NoError(t, sqlSetRetention(c, name, `{"tombstoneRetention": "00:00:00"}`))
	var tomb int32
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT tombstone_retention_seconds FROM streamd.retention_policies WHERE stream_name = $1`, name).Scan(&tomb))
	require.Zero(t, tomb)
	zero := streamconfig.Duration(0)
	require.NoError(t, s.Set(ctx, name, &streamconfig.Config{Retention: &streamconfig.Retention{TombstoneRetention: &zero}}))
}

// Plain SQL cannot store a section that is not a JSON object, or tags with values that
// are not strings (SD301 naming the column; nothing written): every reader, the
// API's access checks among them, relies on that shape. A known key of the wrong type
// inside a section (not checked in SQL) makes Get fail with ErrInvalidConfig naming the
// section, not with a bare JSON error.
func TestSQLConfigSectionsKeepTheirShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, c, name := setup(t)
	for _, bad := range []string{
		`INSERT INTO streamd.stream_configurations (stream_name, tags) VALUES ($1, '{"team": 1}')`,
		`INSERT INTO streamd.stream_configurations (stream_name, tags) VALUES ($1, '["a"]')`,
		`INSERT INTO streamd.stream_configurations (stream_name, access_control_config) VALUES ($1, '"everyone"')`,
		`INSERT INTO streamd.stream_configurations (stream_name, performance_config) VALUES ($1, '1')`,
	} {
		_, err := c.Pool().Exec(ctx, bad, name)
		require.Equal(t, sqlerr.InvalidStreamConfig, sqlerr.Code(err), bad)
	}
	var n int
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT count(*) FROM streamd.stream_configurations WHERE stream_name = $1", name).Scan(&n))
	require.Zero(t, n, "nothing written")

	_, err := c.Pool().Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, tags, access_control_config)
		VALUES ($1, '{"team": "x"}', '{"admins": "x"}')`, name)
	require.NoError(t, err)
	_, err = store.Get(ctx, name)
	require.ErrorIs(t, err, streamconfig.ErrInvalidConfig)
	var fe *streamconfig.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "access_control_config", fe.Field)
}
