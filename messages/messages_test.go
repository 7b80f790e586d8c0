package messages_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// fakeClock is a settable clock for ClientConfig.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now().UTC().Truncate(time.Millisecond)} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// setup returns a client (on a fake clock when clock is not nil) and a new queue.
func setup(t *testing.T, clock *fakeClock, cfg *messages.QueueConfig) (*messages.Client, string) {
	t.Helper()
	pool := testdb.Pool(t)
	return newClient(t, pool, clock), newQueue(t, pool, cfg)
}

func newClient(t *testing.T, pool *pgxpool.Pool, clock *fakeClock) *messages.Client {
	t.Helper()
	cc := &messages.ClientConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if clock != nil {
		cc.Now = clock.Now
	}
	c, err := messages.NewClient(pool, cc)
	require.NoError(t, err)
	return c
}

func newQueue(t *testing.T, pool *pgxpool.Pool, cfg *messages.QueueConfig) string {
	t.Helper()
	c, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	name := testdb.Name("q")
	require.NoError(t, c.CreateQueue(context.Background(), name, cfg))
	return name
}

func data(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// count returns how many messages queue holds.
func count(t *testing.T, pool *pgxpool.Pool, queue string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM streamd.messages WHERE stream_name = $1", queue).Scan(&n))
	return n
}

func TestSendReceiveAckRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q := setup(t, nil, nil)
	res, err := c.Send(ctx, q,
		messages.OutgoingMessage{Data: data(map[string]int{"a": 1}), Headers: map[string]string{"h": "v"}, MessageID: "m1"},
		messages.OutgoingMessage{Data: data(2)})
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Equal(t, "m1", res[0].MessageID)
	require.NotEmpty(t, res[1].MessageID)
	require.Less(t, res[0].Offset, res[1].Offset)

	msgs, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.Equal(t, "m1", msgs[0].MessageID)
	require.JSONEq(t, `{"a":1}`, string(msgs[0].Data))
	require.Equal(t, map[string]string{"h": "v"}, msgs[0].Headers)
	require.Equal(t, 1, msgs[0].DeliveryAttempts)
	require.Equal(t, 1, msgs[0].Receipt.Attempt)
	require.NotEqual(t, msgs[0].Receipt.LeaseToken, msgs[1].Receipt.LeaseToken)

	// Q1: leased messages are invisible to other receivers.
	again, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Empty(t, again)

	require.NoError(t, c.Ack(ctx, msgs[0].Receipt, msgs[1].Receipt))
	require.Equal(t, 0, count(t, c.Pool(), q))
	// A second ack of the same receipt is stale.
	err = c.Ack(ctx, msgs[0].Receipt)
	require.ErrorIs(t, err, messages.ErrLeaseLost)
}

// Each SendResult names the message at its position: for a batch without ids (the
// one-statement send path), result i's id and offset are those of the message whose
// data is message i's.
func TestSendResultsMatchTheirMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q := setup(t, nil, nil)
	out := make([]messages.OutgoingMessage, 50)
	for i := range out {
		out[i] = messages.OutgoingMessage{Data: data(i)}
	}
	res, err := c.Send(ctx, q, out...)
	require.NoError(t, err)
	require.Len(t, res, len(out))
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 100})
	require.NoError(t, err)
	require.Len(t, got, len(out))
	byOffset := map[int64]*messages.Message{}
	for _, m := range got {
		byOffset[m.Offset] = m
	}
	for i, r := range res {
		m := byOffset[r.Offset]
		require.NotNil(t, m, "result %d: offset %d", i, r.Offset)
		require.Equal(t, r.MessageID, m.MessageID, "result %d", i)
		require.JSONEq(t, string(data(i)), string(m.Data), "result %d", i)
		require.False(t, r.Duplicate)
	}
}

func TestDedupReturnsOriginal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q := setup(t, nil, nil)
	first, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), MessageID: "x"})
	require.NoError(t, err)
	again, err := c.Send(ctx, q,
		messages.OutgoingMessage{Data: data(2), MessageID: "y"},
		messages.OutgoingMessage{Data: data(3), MessageID: "x"},
		messages.OutgoingMessage{Data: data(4), MessageID: "y"})
	require.NoError(t, err)
	require.False(t, again[0].Duplicate)
	require.True(t, again[1].Duplicate)
	require.Equal(t, first[0].Offset, again[1].Offset)
	require.True(t, again[2].Duplicate)
	require.Equal(t, again[0].Offset, again[2].Offset)
	require.Equal(t, 2, count(t, c.Pool(), q))
	msgs, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.JSONEq(t, "1", string(msgs[0].Data), "the original is kept")
}

// ReceiveOpts.Ack acks in the receive's round trip: the acked messages are gone, the
// next ones are leased, a stale receipt among the acks comes back as a
// *LeaseLostError beside the received messages, and a receipt of another queue is
// refused before anything is written.
func TestReceiveWithAcks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{VisibilityTimeout: 10 * time.Second})
	other := newQueue(t, c.Pool(), nil)
	for i := range 6 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
	}
	first, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2})
	require.NoError(t, err)
	require.Len(t, first, 2)

	// A receipt of another queue: refused, nothing acked, nothing leased.
	_, err = c.Send(ctx, other, messages.OutgoingMessage{Data: data("o")})
	require.NoError(t, err)
	om, err := c.Receive(ctx, other, nil)
	require.NoError(t, err)
	_, err = c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2, Ack: []messages.Receipt{first[0].Receipt, om[0].Receipt}})
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	require.Equal(t, 6, count(t, c.Pool(), q))
	require.Equal(t, 1, count(t, c.Pool(), other))

	second, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2, Ack: []messages.Receipt{first[0].Receipt, first[1].Receipt}})
	require.NoError(t, err)
	require.Len(t, second, 2)
	require.Equal(t, 4, count(t, c.Pool(), q), "the two acked are gone")
	require.Greater(t, second[0].Offset, first[1].Offset)

	// second[0]'s lease expires and it is received again: its old receipt is stale.
	clock.Advance(11 * time.Second)
	third, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 1})
	require.NoError(t, err)
	require.Len(t, third, 1)
	require.Equal(t, second[0].Offset, third[0].Offset)
	fourth, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10, Ack: []messages.Receipt{second[0].Receipt, third[0].Receipt}})
	var lost *messages.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, []messages.Receipt{second[0].Receipt}, lost.Receipts)
	require.Len(t, fourth, 3, "the messages are returned with the error: second[1] (expired) and two more")
	require.Equal(t, 3, count(t, c.Pool(), q), "third[0] was acked")

	// With Wait on an empty queue: the acks go with the first try.
	rs := make([]messages.Receipt, len(fourth))
	for i, m := range fourth {
		rs[i] = m.Receipt
	}
	none, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10, Wait: 50 * time.Millisecond, Ack: rs})
	require.NoError(t, err)
	require.Empty(t, none)
	require.Equal(t, 0, count(t, c.Pool(), q))
}

// ReceiveOpts.Ack's acks and the receive are one transaction: a receive that fails
// undoes the acks, so the acked messages are still there (and their receipts still
// settle). The receive is made to fail by a trigger on this test's queue only.
func TestReceiveWithAcksIsOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q := setup(t, nil, nil)
	for i := range 3 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
	}
	first, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 1})
	require.NoError(t, err)
	require.Len(t, first, 1)

	fn := pgx.Identifier{"public", strings.ReplaceAll(testdb.Name("fail_receive"), "-", "_")}.Sanitize()
	trg := pgx.Identifier{strings.ReplaceAll(testdb.Name("fail_receive"), "-", "_")}.Sanitize()
	_, err = c.Pool().Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'receive refused by the test'; END$$`)
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, `CREATE TRIGGER `+trg+` BEFORE UPDATE ON streamd.queue_messages FOR EACH ROW
		WHEN (OLD.stream_name = '`+q+`') EXECUTE FUNCTION `+fn+`()`)
	require.NoError(t, err)
	dropped := false
	drop := func() {
		if !dropped {
			_, err := c.Pool().Exec(ctx, `DROP TRIGGER `+trg+` ON streamd.queue_messages; DROP FUNCTION `+fn+`()`)
			require.NoError(t, err)
			dropped = true
		}
	}
	defer drop()

	_, err = c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2, Ack: []messages.Receipt{first[0].Receipt}})
	require.ErrorContains(t, err, "receive refused by the test")
	require.Equal(t, 3, count(t, c.Pool(), q), "the failed receive undid the ack")
	drop()

	require.NoError(t, c.Ack(ctx, first[0].Receipt), "the receipt still holds its lease")
	require.Equal(t, 2, count(t, c.Pool(), q))
}

// Dedup keys are the ids a sender names (and ids a plain SQL INSERT writes); a made id
// is not one. A batch can mix both; only named ids are in the dedup index.
func TestDedupCoversNamedIdsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q := setup(t, nil, nil)
	first, err := c.Send(ctx, q,
		messages.OutgoingMessage{Data: data(1)},
		messages.OutgoingMessage{Data: data(2), MessageID: "named"},
		messages.OutgoingMessage{Data: data(3)})
	require.NoError(t, err)
	require.NotEmpty(t, first[0].MessageID)
	require.NotEqual(t, first[0].MessageID, first[2].MessageID)
	made := first[0].MessageID

	// A plain SQL INSERT's id dedups too (the column's default).
	_, err = c.Pool().Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data) VALUES ($1, 'sql-id', '5')`, q)
	require.NoError(t, err)

	again, err := c.Send(ctx, q,
		messages.OutgoingMessage{Data: data(4), MessageID: "named"},
		messages.OutgoingMessage{Data: data(6), MessageID: "sql-id"},
		messages.OutgoingMessage{Data: data(7), MessageID: made})
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, first[1].Offset, again[0].Offset)
	require.True(t, again[1].Duplicate)
	require.False(t, again[2].Duplicate, "a made id is not a dedup key")
	require.Equal(t, 5, count(t, c.Pool(), q))

	var dedup, plain int
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE dedup), count(*) FILTER (WHERE NOT dedup)
		FROM streamd.messages WHERE stream_name = $1`, q).Scan(&dedup, &plain))
	require.Equal(t, 3, dedup, "named, sql-id and the renamed made id")
	require.Equal(t, 2, plain)

	// A batch that names no id: none is a dedup key.
	_, err = c.Send(ctx, q, messages.OutgoingMessage{Data: data(8)}, messages.OutgoingMessage{Data: data(9)})
	require.NoError(t, err)
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT dedup)
		FROM streamd.messages WHERE stream_name = $1`, q).Scan(&plain))
	require.Equal(t, 4, plain)
}

// A stale receipt (the lease expired and the message was received again) cannot ack,
// nack, extend or term; the current receipt can.
func TestStaleReceiptCannotSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{VisibilityTimeout: 10 * time.Second, MaxDeliveryAttempts: 10})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("x")})
	require.NoError(t, err)

	first, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, first, 1)

	clock.Advance(9 * time.Second) // still leased
	none, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Empty(t, none)

	clock.Advance(2 * time.Second) // the lease expired: redelivered with a new token
	second, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, second, 1)
	require.Equal(t, 2, second[0].DeliveryAttempts)
	stale := first[0].Receipt

	require.ErrorIs(t, c.Ack(ctx, stale), messages.ErrLeaseLost)
	require.ErrorIs(t, c.Nack(ctx, nil, stale), messages.ErrLeaseLost)
	require.ErrorIs(t, c.Extend(ctx, time.Hour, stale), messages.ErrLeaseLost)
	require.ErrorIs(t, c.Term(ctx, "no", stale), messages.ErrLeaseLost)
	var lle *messages.LeaseLostError
	require.ErrorAs(t, c.Ack(ctx, stale), &lle)
	require.Equal(t, []messages.Receipt{stale}, lle.Receipts)

	// Nothing changed: the current lease still holds the message.
	var attempts int
	var vis time.Time
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT delivery_attempts, visibility_timeout FROM streamd.messages
		WHERE stream_name = $1`, q).Scan(&attempts, &vis))
	require.Equal(t, 2, attempts)
	require.WithinDuration(t, second[0].VisibleAt, vis, time.Millisecond)
	require.Equal(t, 1, count(t, c.Pool(), q))

	// A batch with one stale and one current receipt settles the current one.
	err = c.Ack(ctx, stale, second[0].Receipt)
	require.ErrorAs(t, err, &lle)
	require.Len(t, lle.Receipts, 1)
	require.Equal(t, 0, count(t, c.Pool(), q))
}

// TestLeaseTokensAreOnePerDelivery: a receive makes one random UUID and derives its
// messages' lease tokens from it and their offsets (queue_receive). The tokens of one
// receive must all differ, each redelivery must get tokens no earlier delivery had,
// and each token must stay a version-4 UUID.
func TestLeaseTokensAreOnePerDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{VisibilityTimeout: 10 * time.Second, MaxDeliveryAttempts: 10})
	msgs := make([]messages.OutgoingMessage, 100)
	for i := range msgs {
		msgs[i] = messages.OutgoingMessage{Data: data(i)}
	}
	_, err := c.Send(ctx, q, msgs...)
	require.NoError(t, err)

	seen := map[[16]byte]int64{}
	for delivery := 1; delivery <= 3; delivery++ {
		got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 100})
		require.NoError(t, err)
		require.Len(t, got, 100)
		for _, m := range got {
			tok := m.Receipt.LeaseToken
			require.Equal(t, byte(0x40), tok[6]&0xf0, "version 4: %x", tok)
			require.Equal(t, byte(0x80), tok[8]&0xc0, "RFC 4122 variant: %x", tok)
			prev, dup := seen[tok]
			require.False(t, dup, "delivery %d of offset %d has the token of offset %d's earlier one", delivery, m.Offset, prev)
			seen[tok] = m.Offset
		}
		clock.Advance(11 * time.Second) // the leases end: every message is delivered again
	}
	require.Len(t, seen, 300)
}

func TestNackDelayAndExtend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{VisibilityTimeout: 10 * time.Second, MaxDeliveryAttempts: 10})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)

	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, m, 1)
	require.NoError(t, c.Nack(ctx, &messages.NackOpts{Delay: 5 * time.Second, Error: "boom"}, m[0].Receipt))
	require.ErrorIs(t, c.Ack(ctx, m[0].Receipt), messages.ErrLeaseLost, "a nack spends the receipt")
	clock.Advance(4 * time.Second)
	m2, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Empty(t, m2, "still in its nack delay")
	clock.Advance(2 * time.Second)
	m2, err = c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, m2, 1)
	require.Equal(t, "boom", m2[0].LastError)
	require.Equal(t, 2, m2[0].DeliveryAttempts)

	// Extend keeps it invisible past the original lease.
	require.NoError(t, c.Extend(ctx, 30*time.Second, m2[0].Receipt))
	clock.Advance(20 * time.Second)
	m3, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Empty(t, m3)
	clock.Advance(11 * time.Second)
	m3, err = c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, m3, 1)
}

func TestDelayedSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, nil)
	_, err := c.Send(ctx, q,
		messages.OutgoingMessage{Data: data("later"), Delay: time.Hour},
		messages.OutgoingMessage{Data: data("at"), DeliverAt: clock.Now().Add(48 * time.Hour)})
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 5})
	require.NoError(t, err)
	require.Empty(t, m)
	clock.Advance(time.Hour)
	m, err = c.Receive(ctx, q, &messages.ReceiveOpts{Max: 5})
	require.NoError(t, err)
	require.Len(t, m, 1)
	require.JSONEq(t, `"later"`, string(m[0].Data))
	require.NoError(t, c.Ack(ctx, m[0].Receipt))
	clock.Advance(47 * time.Hour)
	m, err = c.Receive(ctx, q, &messages.ReceiveOpts{Max: 5})
	require.NoError(t, err)
	require.Len(t, m, 1)
}

// SendTx checks its messages before its statement: bad input gets its typed error
// and leaves the caller's transaction usable (Send, with no caller's transaction,
// leaves the JSON to the statement's jsonb cast instead).
func TestSendTxBadJSONLeavesTheTransactionUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, nil)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data(1)}, messages.OutgoingMessage{Data: json.RawMessage(`{"a":`)})
	require.ErrorIs(t, err, messages.ErrInvalidJSON)
	require.Contains(t, err.Error(), "message 2")
	_, err = c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data(2)})
	require.NoError(t, err, "the transaction is still usable")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, count(t, pool, q))
}

// The client's JSON checks (json.Valid and pgtext.JSONProblem) refuse what jsonb
// refuses, and nothing else, at the edges json.Valid and jsonb disagree on: SendTx,
// which checks before its statement, then names the message and leaves the caller's
// transaction usable (a lone surrogate escape and a number numeric cannot hold came
// from the statement, and aborted it).
func TestSendTxJSONThatJSONBRefusesLeavesTheTransactionUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, nil)
	for _, p := range []string{
		`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`, `"\udc00\ud800"`, `"\ud800\ud800\udc00"`,
		`"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\\ud800"`, `"e12345 \ud83d\ude00"`,
		`1e131071`, `9.9999e131071`, `1e131072`, `-1e131072`, `1E+131072`, `1e-16383`, `1e-16384`, `0e-16383`,
		`0e-16384`, `0e99999`, `0e1073741822`, `0e1073741823`, `1e99999999999999999999`, `0.000e16000`,
		`[1, 2.5e-16384]`, `{"e99999": 1}`, `"1e-99999"`,
		`0.` + strings.Repeat("0", 16382) + `1`, `0.` + strings.Repeat("0", 16383) + `1`,
		`0.` + strings.Repeat("1", 6383) + `e-9999`, `0.` + strings.Repeat("1", 6385) + `e-9999`,
	} {
		t.Run(p[:min(len(p), 30)], func(t *testing.T) {
			var pgErr error
			var discard string
			if err := pool.QueryRow(ctx, `SELECT $1::text::jsonb::text`, p).Scan(&discard); err != nil {
				pgErr = err
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data(1)}, messages.OutgoingMessage{Data: json.RawMessage(p)})
			if pgErr == nil {
				require.NoError(t, err, "jsonb takes it")
				return
			}
			require.ErrorIs(t, err, messages.ErrInvalidJSON, "jsonb refuses it (%v)", pgErr)
			msg := err.Error()
			_, err = c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data(2)})
			require.NoError(t, err, "the transaction is still usable")
			require.Contains(t, msg, "message 2: data:")
		})
	}
}

// E1: bad input gets a typed error that says what was wrong, and nothing is written.
func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{MaxPayloadBytes: 100})
	fifo := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("keep"), MessageID: "keep"})
	require.NoError(t, err)
	missing := testdb.Name("missing")
	ok := messages.OutgoingMessage{Data: data("fine")}

	cases := []struct {
		name string
		call func() error
		want error
		text string
	}{
		{"unknown queue", func() error { _, err := c.Send(ctx, missing, ok); return err }, messages.ErrQueueNotFound, missing},
		{"invalid name", func() error { _, err := c.Send(ctx, "bad name!", ok); return err }, messages.ErrInvalidName, "bad name!"},
		{"invalid name in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send('a/b', NULL, ARRAY['1'], NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidName, "a/b"},
		{"oversize payload", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: data(strings.Repeat("x", 200))})
			return err
		}, messages.ErrPayloadTooLarge, "allows 100"},
		{"oversize with headers", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), Headers: map[string]string{"h": strings.Repeat("x", 120)}})
			return err
		}, messages.ErrPayloadTooLarge, "allows 100"},
		// The client's JSON checks come before the queue's size limit (the SQL's), on
		// every path: the common batch's statement checks a message's size before its
		// jsonb cast, and its refusal must not jump ahead of a JSON error.
		{"oversize before a later message's invalid JSON", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(strings.Repeat("x", 200))},
				messages.OutgoingMessage{Data: json.RawMessage(`[`)})
			return err
		}, messages.ErrInvalidJSON, "message 2: data is not valid JSON"},
		{"oversize invalid JSON", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`["` + strings.Repeat("x", 200))})
			return err
		}, messages.ErrInvalidJSON, "message 2: data is not valid JSON"},
		{"oversize invalid JSON with headers", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`["` + strings.Repeat("x", 200)), Headers: map[string]string{"h": "v"}})
			return err
		}, messages.ErrInvalidJSON, "message 2: data is not valid JSON"},
		{"invalid JSON", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":`)})
			return err
		}, messages.ErrInvalidJSON, "message 2"},
		{"empty data", func() error { _, err := c.Send(ctx, q, messages.OutgoingMessage{}); return err }, messages.ErrInvalidJSON, "no data"},
		// Send leaves the common batch's JSON to the statement's jsonb cast and names
		// the message only once it refused (send's deferJSON): the errors and their
		// order are those of the checks made first.
		{"invalid UTF-8 in JSON", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage("{\"a\":\"\xff\"}")})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it is not valid UTF-8"},
		{"invalid JSON before a later message's other error", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`[`)},
				messages.OutgoingMessage{Data: data(1), Delay: -time.Second})
			return err
		}, messages.ErrInvalidJSON, "message 2: data is not valid JSON"},
		{"an error before a later message's invalid JSON", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: data(1), Delay: -time.Second},
				messages.OutgoingMessage{Data: json.RawMessage(`[`)})
			return err
		}, messages.ErrInvalidArgument, "message 2: delay -1s is negative"},
		{"invalid JSON before a later message without data", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: json.RawMessage(`[`)}, messages.OutgoingMessage{})
			return err
		}, messages.ErrInvalidJSON, "message 1: data is not valid JSON"},
		{"invalid JSON in a batch with headers", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":}`), Headers: map[string]string{"h": "v"}})
			return err
		}, messages.ErrInvalidJSON, "message 2: data is not valid JSON"},
		// JSON that json.Valid takes and jsonb refuses (a lone UTF-16 surrogate
		// escape): the statement's refusal is ErrInvalidJSON on every path.
		{"lone surrogate", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":"\ud800"}`)})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it holds a UTF-16 high surrogate escape without its low one"},
		{"lone surrogate with headers", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":"\ud800"}`), Headers: map[string]string{"h": "v"}})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it holds a UTF-16 high surrogate escape without its low one"},
		{"lone surrogate in a transaction", func() error {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = c.SendTx(ctx, tx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":"\ud800"}`)})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it holds a UTF-16 high surrogate escape without its low one"},
		// Numbers json.Valid takes and jsonb's numeric cannot hold (22003, which came
		// back untyped on every path).
		{"number out of numeric's range", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`[1e131072]`)})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it holds a number out of the range of PostgreSQL's numeric"},
		{"number out of numeric's scale with headers", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":1e-16384}`), Headers: map[string]string{"h": "v"}})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it holds a number out of the range of PostgreSQL's numeric"},
		{"number out of numeric's range in a transaction", func() error {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = c.SendTx(ctx, tx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`[0e-99999]`)})
			return err
		}, messages.ErrInvalidJSON, "message 2: data: it holds a number out of the range of PostgreSQL's numeric"},
		{"invalid JSON to a missing queue", func() error {
			_, err := c.Send(ctx, missing, messages.OutgoingMessage{Data: json.RawMessage(`nope`)})
			return err
		}, messages.ErrInvalidJSON, "message 1: data is not valid JSON"},
		{"invalid JSON to a FIFO queue", func() error {
			_, err := c.Send(ctx, fifo, messages.OutgoingMessage{Data: json.RawMessage(`nope`), GroupKey: "g"})
			return err
		}, messages.ErrInvalidJSON, "message 1: data is not valid JSON"},
		// What json.Valid accepts and PostgreSQL refuses (they came back as bare PgErrors).
		{"JSON with \u0000", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: json.RawMessage(`{"a":"\u0000"}`)})
			return err
		}, messages.ErrInvalidJSON, "message 2"},
		{"message id with NUL", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: data(1), MessageID: "a\x00"})
			return err
		}, messages.ErrInvalidArgument, "message 2"},
		{"negative delay", func() error {
			_, err := c.Send(ctx, q, ok, messages.OutgoingMessage{Data: data(1), Delay: -time.Second})
			return err
		}, messages.ErrInvalidArgument, "negative"},
		{"negative delay in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, NULL, ARRAY['1'], NULL, ARRAY[-5]::bigint[], NULL, NULL, NULL, NULL, NULL)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "-5 ms is negative"},
		{"fresh ids with a missing id in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, ARRAY['a', NULL], ARRAY['1', '2'], NULL, NULL, NULL, NULL, NULL, NULL, NULL, true)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "need every message id"},
		{"empty fresh id in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, ARRAY['a', ''], ARRAY['1', '2'], NULL, NULL, NULL, NULL, NULL, NULL, NULL, true)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "message 2: message id must be 1 to 512 characters"},
		{"oversize last of fresh ids in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, ARRAY['a', 'b', 'c'], ARRAY['1', '2', repeat('3', 101)], NULL, NULL, NULL, NULL, NULL, NULL, NULL, true)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrPayloadTooLarge, "message 3 is 101 bytes"},
		{"null data with fresh ids in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, ARRAY['a', 'b'], ARRAY['1', NULL], NULL, NULL, NULL, NULL, NULL, NULL, NULL, true)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "message 2 has no data"},
		{"delay and deliver-at", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), Delay: time.Second, DeliverAt: time.Now()})
			return err
		}, messages.ErrInvalidArgument, "not both"},
		{"group key on standard queue", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), GroupKey: "g"})
			return err
		}, messages.ErrInvalidArgument, "needs a FIFO queue"},
		{"FIFO without group key", func() error { _, err := c.Send(ctx, fifo, ok); return err }, messages.ErrInvalidArgument, "group key"},
		// The common FIFO batch (fresh ids, data and group keys) checks its group keys
		// on the groups' lock and its payloads on the insert: the errors and their
		// order are queue_send_check's.
		{"FIFO batch with a message without group key", func() error {
			_, err := c.Send(ctx, fifo, messages.OutgoingMessage{Data: data(1), GroupKey: "g"}, ok)
			return err
		}, messages.ErrInvalidArgument, "message 2: a FIFO queue needs a group key"},
		{"FIFO oversize group key", func() error {
			_, err := c.Send(ctx, fifo, messages.OutgoingMessage{Data: data(1), GroupKey: "g"},
				messages.OutgoingMessage{Data: data(1), GroupKey: strings.Repeat("g", 513)})
			return err
		}, messages.ErrInvalidArgument, "message 2: a FIFO queue needs a group key of 1 to 512 characters"},
		{"FIFO payload error before a group key error in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, ARRAY['a', 'b'], ARRAY['1', NULL], NULL, NULL, NULL, ARRAY[repeat('g', 513), 'g'], NULL, NULL, NULL, true)", fifo)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "message 2 has no data"},
		{"FIFO empty fresh id in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_send($1, ARRAY['a', ''], ARRAY['1', '2'], NULL, NULL, NULL, ARRAY['g', 'h'], NULL, NULL, NULL, true)", fifo)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "message 2: message id must be 1 to 512 characters"},
		{"unknown dead-letter queue", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), DeadLetterQueue: missing})
			return err
		}, messages.ErrQueueNotFound, missing},
		{"negative max attempts", func() error {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), MaxDeliveryAttempts: -1})
			return err
		}, messages.ErrInvalidArgument, "negative"},
		{"negative visibility timeout", func() error {
			_, err := c.Receive(ctx, q, &messages.ReceiveOpts{VisibilityTimeout: -time.Second})
			return err
		}, messages.ErrInvalidArgument, "VisibilityTimeout"},
		{"negative visibility timeout in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_receive($1, 1, -1, NULL)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "must be positive"},
		{"receive max too large", func() error { _, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10001}); return err }, messages.ErrInvalidArgument, "Max"},
		{"receive unknown queue", func() error { _, err := c.Receive(ctx, missing, nil); return err }, messages.ErrQueueNotFound, missing},
		{"negative nack delay", func() error {
			return c.Nack(ctx, &messages.NackOpts{Delay: -time.Second}, messages.Receipt{Queue: q, Offset: 1})
		}, messages.ErrInvalidArgument, "Delay"},
		{"extend under 1ms", func() error { return c.Extend(ctx, 0, messages.Receipt{Queue: q, Offset: 1}) }, messages.ErrInvalidArgument, "1ms"},
		// Offsets are never negative (E1); an ack of MaxInt64 and -MaxInt64 overflowed
		// the SQL's offset range (an untyped 22003).
		{"ack negative offset", func() error { return c.Ack(ctx, messages.Receipt{Queue: q, Offset: -1}) }, messages.ErrInvalidArgument, "negative"},
		{"nack negative offset", func() error { return c.Nack(ctx, nil, messages.Receipt{Queue: q, Offset: -1}) }, messages.ErrInvalidArgument, "negative"},
		{"ack far-apart offsets in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_ack($1, ARRAY[9223372036854775807, -9223372036854775807], ARRAY[gen_random_uuid(), gen_random_uuid()], NULL)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "negative"},
		{"nack negative offset in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_nack($1, ARRAY[-1]::bigint[], ARRAY[gen_random_uuid()], ARRAY[0]::bigint[], NULL, NULL)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "negative"},
		{"extend negative offset in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_extend($1, ARRAY[-1]::bigint[], ARRAY[gen_random_uuid()], 1000, NULL)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "negative"},
		{"term negative offset in SQL", func() error {
			_, err := pool.Exec(ctx, "SELECT * FROM streamd.queue_term($1, ARRAY[-1]::bigint[], ARRAY[gen_random_uuid()], NULL, NULL)", q)
			return sqlerr.Wrap(err)
		}, messages.ErrInvalidArgument, "negative"},
		// Admin calls check the name first (they answered ErrQueueNotFound).
		{"delete queue invalid name", func() error { return c.DeleteQueue(ctx, "bad name!") }, messages.ErrInvalidName, "bad name!"},
		{"get queue invalid name", func() error { _, err := c.GetQueue(ctx, "bad name!"); return err }, messages.ErrInvalidName, "bad name!"},
		{"stats invalid name", func() error { _, err := c.Stats(ctx, "bad name!"); return err }, messages.ErrInvalidName, "bad name!"},
		{"create queue negative timeout", func() error {
			return c.CreateQueue(ctx, testdb.Name("q"), &messages.QueueConfig{VisibilityTimeout: -time.Second})
		}, messages.ErrInvalidArgument, "VisibilityTimeout"},
		{"create queue unknown dead-letter queue", func() error {
			return c.CreateQueue(ctx, testdb.Name("q"), &messages.QueueConfig{DeadLetterQueue: missing})
		}, messages.ErrQueueNotFound, missing},
		{"create queue FIFO dead-letter queue", func() error {
			return c.CreateQueue(ctx, testdb.Name("q"), &messages.QueueConfig{DeadLetterQueue: fifo})
		}, messages.ErrInvalidArgument, "FIFO"},
		{"create queue invalid name", func() error { return c.CreateQueue(ctx, "..", nil) }, messages.ErrInvalidName, ".."},
		{"queue type change", func() error { return c.CreateQueue(ctx, q, &messages.QueueConfig{FIFO: true}) }, messages.ErrInvalidArgument, "cannot change"},
	}
	var queuesBefore int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.queues WHERE queue_name IN ($1, $2) AND fifo = (queue_name = $2)", q, fifo).Scan(&queuesBefore))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.text)
			require.Equal(t, 1, count(t, pool, q), "nothing written")
			require.Equal(t, 0, count(t, pool, fifo), "nothing written")
			var groups int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.message_groups WHERE stream_name = $1", fifo).Scan(&groups))
			require.Zero(t, groups, "no group written")
			require.Equal(t, 0, count(t, pool, missing), "nothing written")
		})
	}
	var queuesAfter int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.queues WHERE queue_name IN ($1, $2) AND fifo = (queue_name = $2)", q, fifo).Scan(&queuesAfter))
	require.Equal(t, 2, queuesAfter)
	require.Equal(t, queuesBefore, queuesAfter)
	var missingQueues int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.queues WHERE queue_name = $1", missing).Scan(&missingQueues))
	require.Zero(t, missingQueues)
	_ = fmt.Sprint
	_ = errors.Is
}

// TestNackBackoffSchedule: NackOpts.Backoff delays each receipt's message by its own
// delivery attempt, in one call; a schedule that gives a negative delay is refused
// and nothing is nacked.
func TestNackBackoffSchedule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{VisibilityTimeout: time.Minute, MaxDeliveryAttempts: 10})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("a")}, messages.OutgoingMessage{Data: data("b")})
	require.NoError(t, err)
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2})
	require.NoError(t, err)
	require.Len(t, got, 2)
	// "b" goes back at once and comes again: its second attempt.
	require.NoError(t, c.Nack(ctx, nil, got[1].Receipt))
	again, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.Equal(t, 2, again[0].DeliveryAttempts)

	sched := func(attempt int) time.Duration { return time.Duration(attempt) * 10 * time.Second }
	bad := func(int) time.Duration { return -time.Second }
	require.ErrorIs(t, c.Nack(ctx, &messages.NackOpts{Backoff: bad}, got[0].Receipt, again[0].Receipt), messages.ErrInvalidArgument)
	require.NoError(t, c.Ack(ctx, got[0].Receipt), "the refused nack left the receipt unspent")
	_, err = c.Send(ctx, q, messages.OutgoingMessage{Data: data("c")})
	require.NoError(t, err)
	first, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.Equal(t, 1, first[0].DeliveryAttempts)

	// "c" (attempt 1) waits 10 s, "b" (attempt 2) 20 s.
	require.NoError(t, c.Nack(ctx, &messages.NackOpts{Backoff: sched, Delay: time.Hour}, first[0].Receipt, again[0].Receipt))
	clock.Advance(11 * time.Second)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, m, 1)
	require.JSONEq(t, `"c"`, string(m[0].Data))
	clock.Advance(10 * time.Second)
	m, err = c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, m, 1)
	require.JSONEq(t, `"b"`, string(m[0].Data))
}

// TestSettleRefusesNegativeOffsets guards E1 for settlements: a receipt with a
// negative offset is refused with ErrInvalidArgument before anything is settled, in
// Go (across queues) and in the SQL. An ack of far-apart offsets (MaxInt64 and
// -MaxInt64) overflowed queue_ack's offset range, an untyped error that acked none of
// the call's valid receipts.
func TestSettleRefusesNegativeOffsets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	a, b := newQueue(t, pool, nil), newQueue(t, pool, nil)
	for _, q := range []string{a, b} {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(q)})
		require.NoError(t, err)
	}
	ma, err := c.Receive(ctx, a, nil)
	require.NoError(t, err)
	mb, err := c.Receive(ctx, b, nil)
	require.NoError(t, err)
	require.Len(t, ma, 1)
	require.Len(t, mb, 1)

	huge := messages.Receipt{Queue: b, Offset: math.MaxInt64}
	negative := messages.Receipt{Queue: b, Offset: -math.MaxInt64}
	err = c.Ack(ctx, ma[0].Receipt, mb[0].Receipt, huge, negative)
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	require.ErrorContains(t, err, "negative")
	require.Equal(t, 1, count(t, pool, a), "queue a (settled first) kept its message")
	require.Equal(t, 1, count(t, pool, b))

	_, err = pool.Exec(ctx, "SELECT * FROM streamd.queue_ack($1, $2, $3, NULL)", b,
		[]int64{mb[0].Offset, math.MaxInt64, -math.MaxInt64}, [][16]byte{mb[0].Receipt.LeaseToken, {1}, {2}})
	require.ErrorIs(t, sqlerr.Wrap(err), messages.ErrInvalidArgument)
	require.Equal(t, 1, count(t, pool, b), "nothing acked")

	// Far apart and not negative: the valid receipts are acked, the other is stale.
	err = c.Ack(ctx, ma[0].Receipt, mb[0].Receipt, huge)
	require.ErrorIs(t, err, messages.ErrLeaseLost)
	var lle *messages.LeaseLostError
	require.ErrorAs(t, err, &lle)
	require.Equal(t, []messages.Receipt{huge}, lle.Receipts)
	require.Zero(t, count(t, pool, a))
	require.Zero(t, count(t, pool, b))
}

// TestTimesCountFromTheCallNotTheTransaction guards Q1's timing inside a long
// transaction: a send's Delay and enqueue time, a FIFO group's visible time, a
// receive's lease, an extension and a nack delay count from the call, not from the
// start of the caller's transaction (now()). A SendTx in an outbox transaction that
// had run longer than the delay made the message visible at commit.
func TestTimesCountFromTheCallNotTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, nil)
	fifo := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The transaction has been running for a while (its other work) when it sends.
	var begun, t0 time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now(), clock_timestamp() FROM pg_sleep(1.5)").Scan(&begun, &t0))
	require.True(t, t0.Sub(begun) >= 1500*time.Millisecond)

	// Shorter than the transaction so far, and long enough that the statements
	// between the send and the receive below cannot take it (250 ms did at load 17).
	const delay = 1200 * time.Millisecond
	res, err := c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data("delayed"), Delay: delay}, messages.OutgoingMessage{Data: data("now")})
	require.NoError(t, err)
	_, err = c.SendTx(ctx, tx, fifo, messages.OutgoingMessage{Data: data(1), GroupKey: "g", Delay: time.Hour})
	require.NoError(t, err)
	var enqueued, notBefore, groupVisible time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT enqueued_at, not_before FROM streamd.messages WHERE stream_name = $1 AND "offset" = $2`,
		q, res[0].Offset).Scan(&enqueued, &notBefore))
	require.False(t, enqueued.Before(t0), "enqueued_at %v is the transaction's start, not the send (%v)", enqueued, t0)
	require.False(t, notBefore.Before(t0.Add(delay)), "the delay counts from the transaction's start")
	require.NoError(t, tx.QueryRow(ctx, `SELECT visible_at FROM streamd.message_groups WHERE stream_name = $1`, fifo).Scan(&groupVisible))
	require.False(t, groupVisible.Before(t0.Add(time.Hour)), "the FIFO group's delay counts from the transaction's start")

	// A receive, an extension and a nack in the same transaction (plain SQL).
	var off int64
	var token [16]byte
	var leaseEnd time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT "offset", lease_token, visibility_timeout FROM streamd.queue_receive($1, 10, 60000, NULL)`,
		q).Scan(&off, &token, &leaseEnd))
	require.Equal(t, res[1].Offset, off, "only the undelayed message is visible")
	require.False(t, leaseEnd.Before(t0.Add(time.Minute)), "the lease counts from the transaction's start")
	require.NoError(t, tx.QueryRow(ctx, `SELECT visibility_timeout FROM streamd.queue_extend($1, $2, $3, 60000, NULL)`,
		q, []int64{off}, [][16]byte{token}).Scan(&leaseEnd))
	require.False(t, leaseEnd.Before(t0.Add(time.Minute)), "the extension counts from the transaction's start")
	_, err = tx.Exec(ctx, `SELECT * FROM streamd.queue_nack($1, $2, $3, ARRAY[60000]::bigint[], NULL, NULL)`, q, []int64{off}, [][16]byte{token})
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `SELECT not_before FROM streamd.messages WHERE stream_name = $1 AND "offset" = $2`,
		q, off).Scan(&notBefore))
	require.False(t, notBefore.Before(t0.Add(time.Minute)), "the nack delay counts from the transaction's start")
	require.NoError(t, tx.Commit(ctx))

	// Committed after more than the delay since the transaction began, but right
	// after the send: not visible yet. (Unless the statements since the send took
	// the delay: the check counts from before the send, t0, not from the commit,
	// which on a loaded machine let a message that was due fail it.)
	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	if time.Since(t0) < delay {
		require.Empty(t, m, "a message sent with Delay %v was visible at commit", delay)
	}
}
