package kafka

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// The Python clients with SCRAM: confluent-kafka (librdkafka; SaslAuthenticate) with
// SCRAM-SHA-512 and -256, kafka-python (its own SCRAM, over SaslHandshake v0's bare
// frames) with SCRAM-SHA-256. A wrong password is refused; the writer produces, the
// reader consumes in a group and commits; the commit is the group's row in streamd.
func TestPythonSCRAM(t *testing.T) {
	python := pythonClients(t) // make test-kafka-clients
	t.Parallel()
	ts, topic := authzSetup(t)
	for _, run := range [][2]string{{"confluent", "SCRAM-SHA-512"}, {"confluent", "SCRAM-SHA-256"}, {"kafka-python", "SCRAM-SHA-256"}} {
		client, mech := run[0], run[1]
		group := testdb.Name("py-scram")
		cmd := exec.CommandContext(testCtx(t), python, "testdata/sasl_scram_client.py")
		cmd.Env = append(os.Environ(), "CLIENT="+client, "BOOTSTRAP="+ts.addr, "TOPIC="+topic, "GROUP="+group, "MECHANISM="+mech,
			"WRITER="+testWriter, "WRITER_PASSWORD="+writerToken, "READER="+testReader, "READER_PASSWORD="+readerToken,
			"BAD_PASSWORD="+badPassword)
		// Each run reads from the start in a new group: the first run's records (the
		// same values) come first.
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s: %s", client, mech, out)
		require.Contains(t, string(out), "bad password refused", client)

		var committed int64
		require.NoError(t, ts.srv.pool.QueryRow(testCtx(t), `SELECT "offset" FROM streamd.consumer_offsets
			WHERE stream_name = $1 AND group_id = $2 AND partition = 0`, topic, group).Scan(&committed), "%s %s: %s", client, mech, out)
		require.Equal(t, int64(5), committed, "%s %s: %s", client, mech, out)
	}
}
