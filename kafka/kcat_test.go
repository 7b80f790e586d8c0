package kafka

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// kcatPath returns kcat's path. Without kcat the test is skipped, unless
// STREAMD_KCAT_TEST=1 (make test-kcat, which installs it) says it must run.
func kcatPath(t *testing.T) string {
	p, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("STREAMD_KCAT_TEST") == "1" {
			t.Fatal("kcat is not installed (make test-kcat installs Debian's kcat)")
		}
		t.Skip("kcat is not installed: make test-kcat installs it and runs this test")
	}
	return p
}

func kcat(t *testing.T, ctx context.Context, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, kcatPath(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "kcat %v: %s", args, errOut.String())
	return out.String()
}

// librdkafka (through kcat) produces with each codec and consumes; an event
// appended by SQL reaches it with the same bytes, and what it produced is read by
// streams.Client with the same bytes and headers.
func TestKcatProducesAndConsumes(t *testing.T) {
	kcatPath(t)
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("kcat")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))

	meta := kcat(t, ctx, "", "-b", ts.addr, "-L", "-t", topic)
	require.Contains(t, meta, topic)
	require.Contains(t, meta, "1 partitions")

	_, err := pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, key, data_bytes) VALUES ($1, 0, 'sql', '\x01ff'::bytea)`, topic)
	require.NoError(t, err)
	var want strings.Builder
	want.WriteString("sql=\x01\xff|\n")
	for _, codec := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		in := fmt.Sprintf("k-%s:v-%s-1\nk-%s:v-%s-2\n", codec, codec, codec, codec)
		kcat(t, ctx, in, "-b", ts.addr, "-t", topic, "-p", "0", "-P", "-K:", "-H", "h1=x", "-H", "h2=y",
			"-X", "compression.codec="+codec, "-X", "enable.idempotence=true")
		fmt.Fprintf(&want, "k-%s=v-%s-1|h1=x,h2=y\nk-%s=v-%s-2|h1=x,h2=y\n", codec, codec, codec, codec)
	}
	got := kcat(t, ctx, "", "-b", ts.addr, "-t", topic, "-C", "-o", "beginning", "-e", "-q", "-f", "%k=%s|%h\n")
	require.Equal(t, want.String(), got)

	// With a consumer group (-G), once the group coordinator is in the handler table.
	if _, ok := ts.srv.table[11]; ok {
		got = kcat(t, ctx, "", "-b", ts.addr, "-G", testdb.Name("kcat-group"), topic, "-o", "beginning", "-e", "-q",
			"-f", "%k=%s|%h\n")
		require.Equal(t, want.String(), got)
	}

	res, err := sc.Fetch(ctx, topic, 0, 1, nil)
	require.NoError(t, err)
	require.Equal(t, []byte("v-none-1"), res.Events[0].Bytes)
	require.Equal(t, "k-none", res.Events[0].Key)
	require.Equal(t, []streams.Header{{Key: "h1", Value: []byte("x")}, {Key: "h2", Value: []byte("y")}}, res.Events[0].RawHeaders)
}
