package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// readmeBlock returns the first block of the language under README.md's heading.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	require.True(t, ok, "README.md has a %s section", heading)
	_, rest, ok = strings.Cut(rest, "```"+lang+"\n")
	require.True(t, ok, "the %s section has a %s block", heading, lang)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	return block
}

// readmeCLIBlock returns the lines of the first sh block under README.md's "## CLI".
func readmeCLIBlock(t *testing.T) []string {
	t.Helper()
	block := readmeBlock(t, "## CLI", "sh")
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestREADMECLIBlock runs README.md's CLI block, line by line as written (read from
// the file, so the two cannot drift), with the built binary on the PATH, against a
// new database: every line succeeds, in order. (stream delete came before the group
// examples, the dead-letter queue listed was never made, and a fetch read a partition
// the key did not go to.)
func TestREADMECLIBlock(t *testing.T) {
	t.Parallel()
	lines := readmeCLIBlock(t)
	require.Greater(t, len(lines), 15)
	bin := binary(t)
	env := []string{"PATH=" + filepath.Dir(bin) + ":" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		localpg.EnvDatabaseURL + "=" + testdb.FreshDatabase(t)}
	outputs := map[string]string{}
	dir := t.TempDir() // one working directory, as in a shell: a file a line writes, a later one reads
	for _, line := range lines {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "README line %q:\n%s", line, out)
		outputs[line] = string(out)
	}
	for line, out := range outputs {
		if strings.HasPrefix(line, "streamd fetch orders -c 10") {
			require.Contains(t, out, `"order_id":1`, line)
			require.Contains(t, out, `"order_id":2`, line)
		}
		if strings.HasPrefix(line, "streamd fetch orders -o beginning -e -f") {
			require.Contains(t, out, ` customer-42={"order_id": 1}`, line, "kcat's %k=%s (jsonb's text)")
			require.Contains(t, out, ` customer-7={"order_id": 2}`, line)
			require.Contains(t, out, "% Reached end of stream orders [5] at offset", line)
		}
		if strings.HasPrefix(line, "streamd consume") {
			require.Equal(t, 2, strings.Count(out, `"order_id"`), "%s:\n%s", line, out)
		}
		if strings.HasPrefix(line, "streamd groups reset-offsets billing --from-file") {
			require.Contains(t, out, "preview only", line)
			require.Regexp(t, `orders\s+\d+\s+\d+\s+\d+`, out, "a row per partition the export listed")
		}
	}
}

// TestREADMESQLBlock runs README.md's "From SQL" block (read from the file, so the two
// cannot drift), statement by statement as written, on a new migrated database:
// every statement runs. The queue statements settle for real: of the three messages
// sent, one stays leased, one is acked and one is archived to the dead-letter queue.
func TestREADMESQLBlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	block := readmeBlock(t, "## From SQL", "sql")
	conn, err := pgx.Connect(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
	var stmt strings.Builder
	n := 0
	for _, l := range strings.Split(block, "\n") {
		if tl := strings.TrimSpace(l); tl == "" || strings.HasPrefix(tl, "--") {
			continue
		}
		stmt.WriteString(l + "\n")
		if strings.HasSuffix(strings.TrimSpace(l), ";") {
			_, err := conn.Exec(ctx, stmt.String())
			require.NoError(t, err, "README statement:\n%s", stmt.String())
			if strings.Contains(stmt.String(), "INSERT INTO streamd.retention_policies") {
				_, err := conn.Exec(ctx, stmt.String())
				require.NoError(t, err, "the retention INSERT is an upsert: it runs again on an existing policy")
			}
			stmt.Reset()
			n++
		}
	}
	require.Empty(t, strings.TrimSpace(stmt.String()), "a statement without its semicolon")
	require.Greater(t, n, 15)
	var total, inFlight int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT total, in_flight FROM streamd.queue_stats('jobs', NULL)").Scan(&total, &inFlight))
	require.Equal(t, []int64{1, 1}, []int64{total, inFlight}, "one of the three is still leased: one was acked, one archived")
	require.NoError(t, conn.QueryRow(ctx, "SELECT total FROM streamd.queue_stats('jobs-archive', NULL)").Scan(&total))
	require.Equal(t, int64(1), total, "the archived message is in the dead-letter queue")
	var maxAge int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT max_age_seconds FROM streamd.retention_policies WHERE stream_name = 'orders'").Scan(&maxAge))
	require.Equal(t, int64(7776000), maxAge)
}
