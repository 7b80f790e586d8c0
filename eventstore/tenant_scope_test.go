package eventstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// Every tenant-scoped table (migrations 0061, 0063) is under the tenant policy: in
// each, a bound role sees only its tenant's rows, updates and deletes only those,
// cannot insert a row of another tenant nor hand its row to one; the owner sees all.
// The group views read as the caller.
func TestTenantScopeEverywhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stream := testdb.Name("tscope")
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, 1)", stream)
	require.NoError(t, err)
	acmeID, globexID := "acme-"+stream, "globex-"+stream
	acme := tenantRole(t, admin, acmeID)

	// insert is one row of the table for tenant (and a suffix that keeps keys apart).
	type table struct {
		name, insert string
		col          string // the column holding the test's stream name ("": stream_name)
	}
	tables := []table{
		{"consumer_groups", `INSERT INTO streamd.consumer_groups (stream_name, group_id, tenant_id) VALUES ($1, 'g-' || $2, $2)`, ""},
		{"consumer_registrations", `INSERT INTO streamd.consumer_registrations (stream_name, group_id, consumer_id, member_epoch, tenant_id) VALUES ($1, 'g-' || $2, 'm', 1, $2)`, ""},
		{"consumer_partitions", `INSERT INTO streamd.consumer_partitions (stream_name, group_id, partition, tenant_id) VALUES ($1, 'g-' || $2, 0, $2)`, ""},
		{"consumer_offsets", `INSERT INTO streamd.consumer_offsets (stream_name, group_id, partition, "offset", committed_by, tenant_id) VALUES ($1, 'g-' || $2, 0, 0, 'm', $2)`, ""},
		{"dead_letter_queue", `INSERT INTO streamd.dead_letter_queue (stream_name, group_id, partition, "offset", event_id, data, error, tenant_id) VALUES ($1, 'g-' || $2, 0, 0, 'e', '{"secret": 1}', 'boom', $2)`, ""},
		{"key_heads", `INSERT INTO streamd.key_heads (stream_name, key, tenant_id) VALUES ($1, 'k-' || $2, $2)`, ""},
		{"snapshots", `INSERT INTO streamd.snapshots (stream_name, key, key_version, data, tenant_id) VALUES ($1, 'k-' || $2, 1, '{}', $2)`, ""},
		{"projections", `INSERT INTO streamd.projections (projection_type, aggregate_id, state, last_event_id, stream_name, partition, last_offset, tenant_id) VALUES ('p', $1 || $2, '{}', 'e', $1, 0, 0, $2)`, ""},
		{"queue_dead_letters", `INSERT INTO streamd.queue_dead_letters (dead_letter_queue, message_id, origin_queue, error, first_failure_at, last_failure_at, tenant_id) VALUES ($1, 'm-' || $2, 'q', 'boom', now(), now(), $2)`, "dead_letter_queue"},
	}
	for i := range tables {
		if tables[i].col == "" {
			tables[i].col = "stream_name"
		}
	}
	for _, tb := range tables {
		for _, tenant := range []string{acmeID, globexID} {
			_, err := admin.Exec(ctx, tb.insert, stream, tenant)
			require.NoError(t, err, "%s for %s", tb.name, tenant)
		}
	}

	for _, tb := range tables {
		scope := `FROM streamd.` + tb.name + ` WHERE ` + tb.col + ` = $1`
		var n int
		var tenants []string
		rows, err := acme.Query(ctx, `SELECT tenant_id `+scope, stream)
		require.NoError(t, err, tb.name)
		tenants, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, tb.name)
		require.Equal(t, []string{acmeID}, tenants, "%s: a tenant sees its own rows only", tb.name)

		tag, err := acme.Exec(ctx, `UPDATE streamd.`+tb.name+` SET tenant_id = tenant_id WHERE `+tb.col+` = $1`, stream)
		require.NoError(t, err, tb.name)
		require.EqualValues(t, 1, tag.RowsAffected(), "%s: an update changes its own row only", tb.name)
		_, err = acme.Exec(ctx, `UPDATE streamd.`+tb.name+` SET tenant_id = $2 WHERE `+tb.col+` = $1`, stream, globexID)
		require.Equal(t, "42501", pgCode(err), "%s: a row cannot be handed to another tenant: %v", tb.name, err)
		_, err = acme.Exec(ctx, tb.insert, stream, globexID+"-2")
		require.Equal(t, "42501", pgCode(err), "%s: no row of another tenant can be inserted: %v", tb.name, err)

		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) `+scope, stream).Scan(&n))
		require.Equal(t, 2, n, "%s: the owner sees both", tb.name)
	}

	// The group views read as the caller.
	var groups []string
	rows, err := acme.Query(ctx, `SELECT DISTINCT group_id FROM streamd.consumer_group_status WHERE stream_name = $1`, stream)
	require.NoError(t, err)
	groups, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"g-" + acmeID}, groups)

	// Deletes: children first (foreign keys), each removing the tenant's row only
	// (key_heads and snapshots are not granted DELETE).
	for i := len(tables) - 1; i >= 0; i-- {
		var may bool
		require.NoError(t, acme.QueryRow(ctx, `SELECT has_table_privilege('streamd.' || $1, 'DELETE')`, tables[i].name).Scan(&may))
		if !may {
			continue
		}
		tag, err := acme.Exec(ctx, `DELETE FROM streamd.`+tables[i].name+` WHERE `+tables[i].col+` = $1`, stream)
		require.NoError(t, err, tables[i].name)
		require.EqualValues(t, 1, tag.RowsAffected(), "%s: a delete removes its own row only", tables[i].name)
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM streamd.`+tables[i].name+` WHERE `+tables[i].col+` = $1`, stream).Scan(&n))
		require.Equal(t, 1, n, tables[i].name)
	}
}
