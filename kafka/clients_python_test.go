package kafka

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// pythonClients returns the Python interpreter that has Debian's Kafka clients
// (python3-confluent-kafka, python3-kafka): $STREAMD_PYTHON, else /usr/bin/python3.
// The test runs only when STREAMD_KAFKA_CLIENTS_TEST=1 (make test-kafka-clients,
// which installs the packages); then a missing client fails it.
func pythonClients(t *testing.T) string {
	if os.Getenv("STREAMD_KAFKA_CLIENTS_TEST") != "1" {
		t.Skip("the Python clients run from make test-kafka-clients (STREAMD_KAFKA_CLIENTS_TEST=1)")
	}
	py := os.Getenv("STREAMD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import confluent_kafka, kafka").CombinedOutput()
	require.NoError(t, err, "%s has no Kafka clients (make test-kafka-clients installs Debian's python3-confluent-kafka and python3-kafka): %s", py, out)
	return py
}

// The Python clients, confluent-kafka (librdkafka, idempotent, lz4) and kafka-python
// (gzip), each produce records with keys and headers, consume them all in a group
// committing as they go, and read their committed offsets back from a new member: the
// offsets are the log ends, in streamd's own table (no lag), and the records are in
// the log with their bytes.
func TestPythonClients(t *testing.T) {
	py := pythonClients(t)
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	sc := streams.NewClient(pool, nil)
	for _, client := range []string{"confluent", "kafka-python"} {
		t.Run(client, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			topic, group := testdb.Name("py-"+client), testdb.Name("py-"+client)
			const partitions, n = 3, 200
			require.NoError(t, sc.CreateStream(ctx, topic, partitions))
			cmd := exec.CommandContext(ctx, py, "testdata/python_clients.py", client, ts.addr, topic, group, strconv.Itoa(n))
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			require.NoError(t, cmd.Run(), "%s: %s", client, errOut.String())
			var res struct {
				Values    []string
				Committed map[string]int64
			}
			require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
			require.Len(t, res.Values, n, "every record consumed")

			var total int64
			for p := int32(0); p < partitions; p++ {
				f, err := sc.Fetch(ctx, topic, p, 0, &streams.FetchOpts{MaxRecords: n})
				require.NoError(t, err)
				if len(f.Events) > 0 {
					require.Equal(t, f.HighWatermark, res.Committed[strconv.Itoa(int(p))], "partition %d committed to its end", p)
				}
				for _, e := range f.Events {
					require.Equal(t, "k"+string(e.Bytes[1:]), e.Key)
					require.Equal(t, []streams.Header{{Key: "h", Value: []byte("x")}}, e.RawHeaders)
				}
				total += f.HighWatermark
			}
			require.Equal(t, int64(n), total, "each record stored once")
			require.True(t, groupLagZero(t, pool, topic, group), "the group's offsets are streamd's")
		})
	}
}
