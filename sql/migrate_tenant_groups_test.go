package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestMigration0014GivesEachTenantItsGroups: migration 0014 makes FIFO groups per
// tenant on a database that has messages. Every group with messages gets a row for
// its tenant, also one whose shared row a tenant's receive had deleted (its messages
// were stranded); a shared row is kept for messages without a tenant, and a row with
// no such messages goes.
func TestMigration0014GivesEachTenantItsGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	all, err := schema.Migrations()
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE SCHEMA streamd")
	require.NoError(t, err)
	var m0014 *schema.Migration
	for i, m := range all {
		if m.Version == 14 {
			m0014 = &all[i]
			break
		}
		_, err := conn.Exec(ctx, m.SQL)
		require.NoError(t, err, m.Name)
	}
	require.NotNil(t, m0014)

	_, err = conn.Exec(ctx, `
		INSERT INTO streamd.queues (queue_name, fifo) VALUES ('q', true);
		INSERT INTO streamd.messages (stream_name, message_id, data, group_key, tenant_id) VALUES
			('q', 'm1', '{}', 'a', NULL),
			('q', 'm2', '{}', 'a', 'acme'),
			('q', 'm3', '{}', 'b', 'globex'),  -- stranded: no group row
			('q', 'm4', '{}', 'c', 'acme');
		INSERT INTO streamd.message_groups (stream_name, group_key, visible_at) VALUES
			('q', 'a', now()), ('q', 'c', now()), ('q', 'z', now());`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, m0014.SQL)
	require.NoError(t, err)

	rows, err := conn.Query(ctx, `SELECT group_key || '/' || tenant_id FROM streamd.message_groups WHERE stream_name = 'q' ORDER BY 1`)
	require.NoError(t, err)
	groups, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a/", "a/acme", "b/globex", "c/acme"}, groups)
}
