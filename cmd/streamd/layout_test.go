package main

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/streamd/streamd"

// TestNoLibraryImportsTheDaemon: no package outside cmd/ depends (directly or not) on
// a package under cmd/ (the daemon's API, coordinator and CLI), so the package
// picture has no arrow running upward. It reads `go list -deps`.
func TestNoLibraryImportsTheDaemon(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "../../...").Output()
	require.NoError(t, err, "go list: %s", exitStderr(err))
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	libraries := 0
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg := fields[0]
		if strings.HasPrefix(pkg, module+"/cmd/") || strings.Contains(pkg, "/cmd/") {
			continue
		}
		libraries++
		for _, dep := range fields[1:] {
			require.False(t, strings.HasPrefix(dep, module+"/cmd/"), "library package %s depends on %s", pkg, dep)
		}
	}
	require.NoError(t, sc.Err())
	require.Greater(t, libraries, 10, "go list found the library packages")
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// sqlText matches a string that holds a SQL statement (or a call of a streamd
// function): what only the libraries may hold.
var sqlText = regexp.MustCompile(`(?is)\b(select\s.+\bfrom\b|select\s+streamd\.|insert\s+into\b|update\s+\S+\s+set\b|delete\s+from\b|create\s+(or\s+replace\s+)?(table|function|view|index)\b|alter\s+table\b|streamd\.[a-z_]+\s*\()`)

// TestNoSQLInTheEdge: the daemon's own code (cmd/streamd and its API package) holds
// no SQL string: it calls library methods. Tests may use SQL to arrange and check.
func TestNoSQLInTheEdge(t *testing.T) {
	t.Parallel()
	// The check itself: it finds SQL where there is some.
	require.True(t, sqlText.MatchString("SELECT streamd.cleanup_stale_consumers()"))
	require.True(t, sqlText.MatchString("SELECT a, b FROM streamd.x WHERE y"))
	require.False(t, sqlText.MatchString("Delete a queue and all its messages"))

	for _, dir := range []string{".", "internal/api", "../../kafka"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, dir)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, nil, 0)
			require.NoError(t, err)
			ast.Inspect(file, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				require.False(t, sqlText.MatchString(s), "%s: SQL in the edge: %q", fset.Position(lit.Pos()), s)
				return true
			})
		}
	}
}
