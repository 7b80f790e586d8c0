package kafka

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// pythonWithConfluentKafka returns Debian's python3 when it has confluent_kafka. Without
// it the test is skipped, unless STREAMD_KAFKA_CLIENTS_TEST=1 (make
// test-kafka-clients, which installs it) says it must run.
func pythonWithConfluentKafka(t *testing.T) string {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import confluent_kafka").Run(); err != nil {
		if os.Getenv("STREAMD_KAFKA_CLIENTS_TEST") == "1" {
			t.Fatalf("%s cannot import confluent_kafka (make test-kafka-clients installs python3-confluent-kafka): %v", python, err)
		}
		t.Skip("no python3-confluent-kafka: make test-kafka-clients installs it and runs this test")
	}
	return python
}

// A Python client (confluent-kafka) with SCRAM-SHA-512 and SCRAM-SHA-256: a wrong
// password is refused; the writer produces (idempotent), the reader consumes in a
// group and commits; the commit is the group's row in streamd.
func TestPythonSCRAM(t *testing.T) {
	python := pythonWithConfluentKafka(t)
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
