package kafka

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// librdkafka (kcat) with SASL PLAIN: the writer produces, the reader consumes in a
// group (-G); a wrong password fails; the reader may not produce and nothing of its
// attempt is written.
func TestKcatSASLPlain(t *testing.T) {
	kcatPath(t)
	t.Parallel()
	ts, topic := authzSetup(t)
	ctx := testCtx(t)
	as := func(user, pass string) []string {
		return []string{"-b", ts.addr, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN",
			"-X", "sasl.username=" + user, "-X", "sasl.password=" + pass}
	}
	kcat(t, ctx, "k1:one\nk2:two\n", append(as(testWriter, writerToken), "-t", topic, "-p", "0", "-P", "-K:")...)
	require.Equal(t, 2, countEvents(t, ts, topic))

	got := kcat(t, ctx, "", append(as(testReader, readerToken), "-G", testdb.Name("kcat-sasl"), topic,
		"-o", "beginning", "-e", "-q", "-f", "%k=%s\n")...)
	require.Equal(t, "k1=one\nk2=two\n", got)

	out, err := kcatFails(ctx, "", append(as(testReader, badPassword), "-L", "-m", "3")...)
	require.Error(t, err, "a wrong password: %s", out)
	require.Contains(t, strings.ToLower(out), "authentication", "kcat says why: %s", out)

	out, err = kcatFails(ctx, "refused\n", append(as(testReader, readerToken), "-t", topic, "-p", "0", "-P")...)
	require.Error(t, err, "the reader may not produce: %s", out)
	require.Contains(t, strings.ToLower(out), "authoriz", "kcat says why: %s", out)
	require.Equal(t, 2, countEvents(t, ts, topic), "the refused produce wrote nothing")
}

// kcatFails runs kcat expecting it to fail; it returns its output (stdout and
// stderr) and its error.
func kcatFails(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kcat", args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
