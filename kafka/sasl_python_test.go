package kafka

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// A Python client (confluent-kafka) with SCRAM-SHA-512 and SCRAM-SHA-256: a wrong
// password is refused; the writer produces (idempotent), the reader consumes in a
// group and commits; the commit is the group's row in streamd.
func TestPythonSCRAM(t *testing.T) {
	python := pythonClients(t) // make test-kafka-clients
	t.Parallel()
	ts, topic := authzSetup(t)
	for _, mech := range []string{"SCRAM-SHA-512", "SCRAM-SHA-256"} {
		group := testdb.Name("py-scram")
		cmd := exec.CommandContext(testCtx(t), python, "testdata/sasl_scram_client.py")
		cmd.Env = append(os.Environ(), "BOOTSTRAP="+ts.addr, "TOPIC="+topic, "GROUP="+group, "MECHANISM="+mech,
			"WRITER="+testWriter, "WRITER_PASSWORD="+writerToken, "READER="+testReader, "READER_PASSWORD="+readerToken,
			"BAD_PASSWORD="+badPassword)
		// Each run reads from the start in a new group: the first run's records (the
		// same values) come first.
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", mech, out)
		require.Contains(t, string(out), "bad password refused", mech)

		var committed int64
		require.NoError(t, ts.srv.pool.QueryRow(testCtx(t), `SELECT "offset" FROM streamd.consumer_offsets
			WHERE stream_name = $1 AND group_id = $2 AND partition = 0`, topic, group).Scan(&committed), "%s: %s", mech, out)
		require.Equal(t, int64(5), committed, "%s: %s", mech, out)
	}
}
