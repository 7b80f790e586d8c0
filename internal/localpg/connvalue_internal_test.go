package localpg

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestConnValueQuotes: a socket directory with a space (a checkout under "My
// Projects") is quoted in the connection string, which pgx then parses back whole.
func TestConnValueQuotes(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"/tmp/run", "/home/me/My Projects/streamd/.state/pg/run", `/tmp/it's`} {
		c := &Cluster{cfg: Config{Port: 5432}, sockDir: dir}
		cfg, err := pgconn.ParseConfig(c.URL("x"))
		require.NoError(t, err, dir)
		require.Equal(t, dir, cfg.Host)
		require.Equal(t, "x", cfg.Database)
	}
}
