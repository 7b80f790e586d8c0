package kafka

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Kafka keys are bytes: a key that is not UTF-8, one with a NUL byte and an empty one
// (which Kafka tells from none) come back exactly, next to text keys and no key. Text
// keys stay in key (text) and the others are in key_bytes, where streams.Client and
// SQL see them; compaction keeps the latest record of each byte key as of a text key.
func TestKeysAreBytes(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	topic := testdb.Name("keys")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	keys := [][]byte{[]byte("text"), nil, {0xff, 0xfe}, {'a', 0, 'b'}, {}, []byte("ключ"), {0xff, 0xfe}, {}, []byte("text")}
	prod := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i, k := range keys {
		require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Key: k, Value: []byte(fmt.Sprintf("v%d", i))}).FirstErr(), "key %d", i)
	}

	got := consumeN(t, ctx, ts.addr, topic, len(keys))
	for i, r := range got {
		require.True(t, bytes.Equal(keys[i], r.Key), "record %d: key %q, want %q", i, r.Key, keys[i])
		require.Equal(t, keys[i] == nil, r.Key == nil, "record %d: a null key stays null, an empty one empty", i)
	}

	res, err := sc.Fetch(ctx, topic, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, len(keys))
	for i, e := range res.Events {
		switch i {
		case 0, 5, 8:
			require.Equal(t, string(keys[i]), e.Key, "a text key is text")
			require.Nil(t, e.KeyBytes)
		case 1:
			require.Empty(t, e.Key)
			require.Nil(t, e.KeyBytes, "no key")
		default:
			require.Empty(t, e.Key)
			require.NotNil(t, e.KeyBytes, "record %d", i)
			require.Equal(t, keys[i], e.KeyBytes, "record %d", i)
		}
	}
	var inBytes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.events WHERE stream_name = $1 AND key IS NULL AND key_bytes = '\xfffe'::bytea`,
		topic).Scan(&inBytes))
	require.Equal(t, 2, inBytes, "SQL sees the byte keys")

	// Compaction: the latest record of each key stays, byte keys included; the
	// keyless record stays.
	var compacted int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT streamd.compact_partition($1, 0, 0, 0, NULL, false)`, topic).Scan(&compacted))
	require.Equal(t, int64(3), compacted, "text, 0xfffe and the empty key each had an older record")
	res, err = sc.Fetch(ctx, topic, 0, 0, nil)
	require.NoError(t, err)
	var kept []string
	for _, e := range res.Events {
		kept = append(kept, string(e.Bytes))
	}
	require.Equal(t, []string{"v1", "v3", "v5", "v6", "v7", "v8"}, kept)
}
