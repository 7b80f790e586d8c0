package eventstore_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// tenantQueue creates a queue (FIFO or standard) and two tenant roles, acme and
// globex, and returns the owner's connection, the queue and the two roles'
// connections.
func tenantQueue(t *testing.T, fifo bool) (admin *pgx.Conn, queue string, acme, globex *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	queue = testdb.Name("tenantq")
	_, err = admin.Exec(ctx, "SELECT streamd.queue_create($1, $2, 30000, 5, NULL, 1048576)", queue, fifo)
	require.NoError(t, err)
	acme = tenantRole(t, admin, "acme-"+queue)
	globex = tenantRole(t, admin, "globex-"+queue)
	return admin, queue, acme, globex
}

// fifoSend sends one message to group of a FIFO queue as conn.
func fifoSend(t *testing.T, conn *pgx.Conn, queue, group, data string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), `SELECT * FROM streamd.queue_send($1, NULL, ARRAY[$2], NULL, NULL, NULL, ARRAY[$3], NULL, NULL, NULL)`,
		queue, data, group)
	require.NoError(t, err)
}

type leased struct {
	Offset int64
	Token  string
	Data   string
}

// receiveAll receives up to 10 messages of queue as conn.
func receiveAll(t *testing.T, conn *pgx.Conn, queue string) []leased {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT "offset", lease_token::text, data::text FROM streamd.queue_receive($1, 10, NULL, NULL)`, queue)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leased, error) {
		var l leased
		err := r.Scan(&l.Offset, &l.Token, &l.Data)
		return l, err
	})
	require.NoError(t, err)
	return out
}

// TestTenantFIFOReceiveLeavesOtherTenantsGroups: tenants sharing a FIFO queue each
// have their own groups. A tenant's receive and ack do not touch the other tenant's
// groups: the group rows were shared, so a receive of acme locked globex's group, saw
// none of its messages, and deleted the row as empty; globex's message was then never
// delivered. Each tenant's group of one key has its own head in flight, and a
// settlement (ack, nack) of one tenant leaves the other's group as it was.
func TestTenantFIFOReceiveLeavesOtherTenantsGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, queue, acme, globex := tenantQueue(t, true)

	fifoSend(t, globex, queue, "g-globex", `{"globex":1}`)
	require.Empty(t, receiveAll(t, acme, queue), "acme has no message")
	got := receiveAll(t, globex, queue)
	require.Len(t, got, 1, "globex's message is still delivered after acme's receive")
	require.Equal(t, `{"globex": 1}`, got[0].Data)

	// The same group key in both tenants: two groups, one head in flight each.
	fifoSend(t, acme, queue, "shared", `{"acme":1}`)
	fifoSend(t, acme, queue, "shared", `{"acme":2}`)
	fifoSend(t, globex, queue, "shared", `{"globex":2}`)
	fifoSend(t, globex, queue, "shared", `{"globex":3}`)
	a := receiveAll(t, acme, queue)
	require.Len(t, a, 1)
	require.Equal(t, `{"acme": 1}`, a[0].Data)
	g := receiveAll(t, globex, queue)
	require.Len(t, g, 1, "acme's message in flight does not hold up globex's group")
	require.Equal(t, `{"globex": 2}`, g[0].Data)
	require.Empty(t, receiveAll(t, acme, queue), "acme's group has its head in flight")

	// acme acks its head; globex's group keeps its row and its order.
	var n int
	require.NoError(t, acme.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack($1, ARRAY[$2::bigint], ARRAY[$3::uuid], NULL)`,
		queue, a[0].Offset, a[0].Token).Scan(&n))
	require.Equal(t, 1, n)
	a = receiveAll(t, acme, queue)
	require.Len(t, a, 1)
	require.Equal(t, `{"acme": 2}`, a[0].Data)
	require.NoError(t, globex.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack($1, ARRAY[$2::bigint], ARRAY[$3::uuid], NULL)`,
		queue, g[0].Offset, g[0].Token).Scan(&n))
	require.Equal(t, 1, n)
	g = receiveAll(t, globex, queue)
	require.Len(t, g, 1)
	require.Equal(t, `{"globex": 3}`, g[0].Data)
	// A nack of acme's head puts it back first in its group; globex's head stays
	// in flight.
	require.NoError(t, acme.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_nack($1, ARRAY[$2::bigint], ARRAY[$3::uuid], NULL, NULL, NULL)`,
		queue, a[0].Offset, a[0].Token).Scan(&n))
	require.Equal(t, 1, n)
	require.Empty(t, receiveAll(t, globex, queue), "globex's group has its head in flight")
	a = receiveAll(t, acme, queue)
	require.Len(t, a, 1)
	require.Equal(t, `{"acme": 2}`, a[0].Data)

	// Every message left has its group row, of its own tenant.
	var orphans int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM streamd.messages m WHERE m.stream_name = $1
		AND NOT EXISTS (SELECT 1 FROM streamd.message_groups gr WHERE gr.stream_name = m.stream_name
		                AND gr.group_key = m.group_key AND gr.tenant_id = coalesce(m.tenant_id, ''))`, queue).Scan(&orphans))
	require.Zero(t, orphans)
}

// TestTenantQueuePurgeKeepsOtherTenants: a tenant's purge of a shared FIFO queue
// deletes its own messages and groups only; the other tenant's are still delivered.
func TestTenantQueuePurgeKeepsOtherTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, queue, acme, globex := tenantQueue(t, true)
	fifoSend(t, acme, queue, "g", `{"acme":1}`)
	fifoSend(t, globex, queue, "g", `{"globex":1}`)
	fifoSend(t, globex, queue, "h", `{"globex":2}`)

	var purged int64
	require.NoError(t, acme.QueryRow(ctx, "SELECT streamd.queue_purge($1)", queue).Scan(&purged))
	require.Equal(t, int64(1), purged)
	var msgs, groups int
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM streamd.messages WHERE stream_name = $1),
		(SELECT count(*) FROM streamd.message_groups WHERE stream_name = $1)`, queue).Scan(&msgs, &groups))
	require.Equal(t, 2, msgs, "globex's messages are kept")
	require.Equal(t, 2, groups, "globex's groups are kept")
	require.Len(t, receiveAll(t, globex, queue), 2)
}

// TestTenantQueueSendRefusesOtherTenantsMessageID: the dedup index of a queue is
// shared by its tenants. A tenant's send of a message id that another tenant's message
// holds is refused with ErrInvalidArgument and stores nothing of the batch; it was
// reported as a duplicate of no offset and the message was lost. A tenant's own
// duplicate is still a duplicate.
func TestTenantQueueSendRefusesOtherTenantsMessageID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, queue, acme, globex := tenantQueue(t, false)
	pool, err := pgxpool.New(ctx, globex.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()
	client, err := messages.NewClient(pool, nil)
	require.NoError(t, err)

	_, err = acme.Exec(ctx, `SELECT * FROM streamd.queue_send($1, ARRAY['order-1'], ARRAY['{"a":1}'], NULL, NULL, NULL, NULL, NULL, NULL, NULL)`, queue)
	require.NoError(t, err)

	_, err = client.Send(ctx, queue,
		messages.OutgoingMessage{MessageID: "order-2", Data: json.RawMessage(`{"b":2}`)},
		messages.OutgoingMessage{MessageID: "order-1", Data: json.RawMessage(`{"b":1}`)})
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	require.ErrorContains(t, err, "order-1")
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM streamd.messages WHERE stream_name = $1`, queue).Scan(&n))
	require.Equal(t, 1, n, "nothing of globex's batch is stored")
	// A plain INSERT is refused the same way (docs/tenants.md).
	_, err = globex.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data) VALUES ($1, 'order-1', '{}')`, queue)
	require.Equal(t, "SD204", pgCode(err), "%v", err)

	// globex's own ids still deduplicate.
	first, err := client.Send(ctx, queue, messages.OutgoingMessage{MessageID: "order-2", Data: json.RawMessage(`{"b":2}`)})
	require.NoError(t, err)
	again, err := client.Send(ctx, queue, messages.OutgoingMessage{MessageID: "order-2", Data: json.RawMessage(`{"b":2}`)})
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, first[0].Offset, again[0].Offset)
}
