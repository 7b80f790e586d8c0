package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
)

// readmeCLIBlock returns the lines of the first sh block under README.md's "## CLI".
func readmeCLIBlock(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n## CLI\n")
	require.True(t, ok, "README.md has a ## CLI section")
	_, rest, ok = strings.Cut(rest, "```sh\n")
	require.True(t, ok, "the CLI section has an sh block")
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
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
	for _, line := range lines {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir, cmd.Env = t.TempDir(), env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "README line %q:\n%s", line, out)
		outputs[line] = string(out)
	}
	for line, out := range outputs {
		if strings.HasPrefix(line, "streamd fetch orders --max 10") {
			require.Contains(t, out, `"order_id":1`, line)
			require.Contains(t, out, `"order_id":2`, line)
		}
		if strings.HasPrefix(line, "streamd consume") {
			require.Equal(t, 2, strings.Count(out, `"order_id"`), "%s:\n%s", line, out)
		}
	}
}
