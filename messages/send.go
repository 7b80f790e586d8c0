package messages

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// OutgoingMessage is a message to send. Only the payload is required: Data or Bytes.
type OutgoingMessage struct {
	// Bytes is an opaque binary payload (stored as data_bytes: protobuf, a Kafka
	// record's value); set Data or Bytes, not both.
	Bytes []byte
	// Data is the payload: valid JSON.
	Data json.RawMessage
	// DeadLetterQueue overrides the queue's dead-letter queue for this message; it
	// must exist and be standard. Defaults to the queue's.
	DeadLetterQueue string
	// Delay keeps the message invisible for this long after the send (no cap). On a
	// standard queue a delayed message (Delay, or DeliverAt in the future) goes to the
	// queue's delayed lane: its offset is after every undelayed message's (from 2^52
	// up), so receives do not read past it while it waits. Defaults to 0.
	Delay time.Duration
	// DeliverAt keeps the message invisible until this time; set Delay or DeliverAt,
	// not both. Defaults to the zero time: Delay applies.
	DeliverAt time.Time
	// GroupKey is the FIFO message group; required on FIFO queues, refused on standard
	// ones.
	GroupKey string
	// Headers travel with the message (stored as the metadata JSON object).
	Headers map[string]string
	// MaxDeliveryAttempts overrides the queue's setting for this message. Defaults to
	// the queue's.
	MaxDeliveryAttempts int
	// MessageID deduplicates: while the queue holds a message with this id, a send
	// with the same id stores nothing and returns the original's offset. Defaults to
	// a random UUID, which is not a dedup key: a later send that names that UUID is
	// not taken for a duplicate of it.
	MessageID string
}

// SendResult is where a sent message went.
type SendResult struct {
	MessageID string `json:"message_id"`
	Offset    int64  `json:"offset"`
	// Duplicate is true when the queue already held a message with this MessageID
	// (Offset is then the original's), or the batch named it twice.
	Duplicate bool `json:"duplicate"`
}

// Send stores msgs in queue atomically in one transaction and returns their results
// in the order given. Errors (nothing is stored): ErrQueueNotFound, ErrInvalidName,
// ErrInvalidJSON, ErrPayloadTooLarge, ErrInvalidArgument.
func (c *Client) Send(ctx context.Context, queue string, msgs ...OutgoingMessage) ([]SendResult, error) {
	// One statement (streamd.queue_send) is atomic on its own: no explicit
	// transaction, which saves two round trips. No caller's transaction either, so the
	// common batch's JSON may be checked by the statement's jsonb cast rather than here
	// first (send's deferJSON).
	out, err := c.send(ctx, c.pool, queue, msgs, true)
	if err != nil {
		return nil, err
	}
	c.countSent(queue, out)
	c.Notify(queue)
	return out, nil
}

// SendTx stores msgs inside the caller's transaction tx: they become visible when, and
// only if, tx commits. Call Notify(queue) after the commit to wake this Client's long
// polls at once. Sends to one FIFO group wait for each other's transactions.
func (c *Client) SendTx(ctx context.Context, tx streams.DBTX, queue string, msgs ...OutgoingMessage) ([]SendResult, error) {
	out, err := c.send(ctx, tx, queue, msgs, false)
	if err == nil {
		c.countSent(queue, out)
	}
	return out, err
}

func (c *Client) countSent(queue string, out []SendResult) {
	n := 0
	for _, r := range out {
		if !r.Duplicate {
			n++
		}
	}
	c.metrics.add(c.metrics.sent, queue, n)
}

// send validates msgs, then stores them with one statement. With deferJSON (a send
// outside any caller's transaction), the common batch's payloads are not checked for
// JSON here: the statement's jsonb cast refuses what json.Valid and JSONProblem would
// (and stores nothing), and only once the statement failed does the client look for
// the message to name (its JSON error wins over the statement's, as where the checks
// ran first; refusedJSON). Those checks cost the client about 27 µs a batch of 100 small
// payloads, a tenth of its CPU per send (bench/RESULTS.md, "Issue 22, session 17").
// In a caller's transaction the failed statement would abort it, so SendTx checks
// first. Errors come in message order either way: a message's other checks run
// after the JSON of every message up to it is known good.
func (c *Client) send(ctx context.Context, db streams.DBTX, queue string, msgs []OutgoingMessage, deferJSON bool) ([]SendResult, error) {
	if err := checkName(queue); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	n := len(msgs)
	var (
		ids       = make([]*string, n)
		data      = make([]*string, n)
		bytesData = make([][]byte, n)
		anyBytes  bool
		meta      = make([]*string, n)
		delays    = make([]*int64, n)
		deliverAt = make([]*time.Time, n)
		groups    = make([]*string, n)
		attempts  = make([]*int32, n)
		dlqs      = make([]*string, n)
		fresh     = true // every id made here
	)
	for i := range msgs {
		m := &msgs[i]
		if err := checkShape(queue, i, m); err != nil {
			return nil, cmp.Or(firstJSONProblem(queue, msgs[:i], deferJSON), err)
		}
		if !deferJSON {
			if err := checkJSON(queue, i, m); err != nil {
				return nil, err
			}
		}
		if err := checkOther(queue, i, m); err != nil {
			return nil, cmp.Or(firstJSONProblem(queue, msgs[:i+1], deferJSON), err)
		}
		if m.Bytes != nil {
			bytesData[i] = m.Bytes
			anyBytes = true
		} else {
			d := string(m.Data)
			data[i] = &d
		}
		if m.MessageID != "" {
			ids[i] = &m.MessageID
			fresh = false
		}
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("queue %s: message %d: encode headers: %w", queue, i+1, err)
			}
			s := string(b)
			meta[i] = &s
		}
		if m.Delay > 0 {
			ms := m.Delay.Milliseconds()
			delays[i] = &ms
		}
		if !m.DeliverAt.IsZero() {
			deliverAt[i] = &m.DeliverAt
		}
		if m.GroupKey != "" {
			groups[i] = &m.GroupKey
		}
		if m.MaxDeliveryAttempts > 0 {
			a := int32(m.MaxDeliveryAttempts)
			attempts[i] = &a
		}
		if m.DeadLetterQueue != "" {
			dlqs[i] = &m.DeadLetterQueue
		}
	}
	plain := fresh && !anyBytes && nilIfAllNil(meta) == nil && nilIfAllNil(delays) == nil && nilIfAllNil(deliverAt) == nil &&
		nilIfAllNil(groups) == nil && nilIfAllNil(attempts) == nil && nilIfAllNil(dlqs) == nil
	if fresh {
		// No message names an id: the ids are made here rather than by the SQL
		// (which does the same for other clients, and for the unnamed ids of a batch
		// that names some): a UUID costs the database server as much as a tenth of
		// the insert, and the server is what a busy queue waits for. A made id is
		// not a dedup key (queue_send's p_fresh_ids).
		made := freshIDs(n)
		if plain {
			texts := make([]string, n)
			for i, d := range data {
				texts[i] = *d // plain: every message has JSON data
			}
			out, ok, err := c.sendDirect(ctx, db, queue, made, texts)
			if err != nil && deferJSON {
				// The client's JSON checks come before the SQL's (as where they ran
				// first): the statement checks a message's size before its jsonb cast,
				// so its ErrPayloadTooLarge can stand for a batch that holds bad JSON.
				if jerr := firstJSONProblem(queue, msgs, true); jerr != nil {
					return nil, jerr
				}
			}
			if err != nil {
				return nil, refusedJSON(queue, msgs, err)
			}
			if ok {
				return out, nil
			}
			// No such queue, or a FIFO queue: queue_send raises the typed error.
		}
		for i := range ids {
			ids[i] = &made[i]
		}
	}
	if deferJSON {
		// Not the common batch, or no queue to take it: checked here, as SendTx does.
		if err := firstJSONProblem(queue, msgs, true); err != nil {
			return nil, err
		}
	}
	// An option no message sets travels as one NULL instead of n: less to encode
	// and decode, and queue_send skips what a NULL array does not need.
	var binary [][]byte // NULL unless a message is binary
	if anyBytes {
		binary = bytesData
	}
	// The message ids come back only when the SQL makes some (a batch that names some
	// ids and not others); otherwise they are the ones sent, and a result row is the
	// smaller without them.
	idsKnown := !slices.Contains(ids, nil) // every id made here or named
	cols := `ord, "offset", message_id, duplicate`
	if idsKnown {
		cols = `ord, "offset", NULL::text, duplicate`
	}
	rows, err := db.Query(ctx, `SELECT `+cols+`
		FROM streamd.queue_send($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		queue, ids, data, nilIfAllNil(meta), nilIfAllNil(delays), nilIfAllNil(deliverAt), nilIfAllNil(groups),
		nilIfAllNil(attempts), nilIfAllNil(dlqs), c.sqlNow(), fresh, binary)
	if err != nil {
		return nil, refusedJSON(queue, msgs, fmt.Errorf("send to queue %s: %w", queue, sqlerr.Wrap(err)))
	}
	defer rows.Close()
	out := make([]SendResult, n)
	for rows.Next() {
		var (
			ord int32
			off *int64
			id  *string
			r   SendResult
		)
		if err := rows.Scan(&ord, &off, &id, &r.Duplicate); err != nil {
			return nil, fmt.Errorf("send to queue %s: %w", queue, err)
		}
		if off != nil {
			r.Offset = *off
		}
		if ord >= 1 && int(ord) <= n {
			if id != nil {
				r.MessageID = *id
			} else if ids[ord-1] != nil {
				r.MessageID = *ids[ord-1]
			}
			out[ord-1] = r
		}
	}
	if err := rows.Err(); err != nil {
		return nil, refusedJSON(queue, msgs, fmt.Errorf("send to queue %s: %w", queue, sqlerr.Wrap(err)))
	}
	return out, nil
}

// checkShape checks that m has one payload, and data if it has no bytes.
func checkShape(queue string, i int, m *OutgoingMessage) error {
	if m.Bytes != nil {
		if m.Data != nil {
			return invalid(ErrInvalidArgument, "queue %s: message %d: set Data or Bytes, not both", queue, i+1)
		}
	} else if len(m.Data) == 0 {
		return invalid(ErrInvalidJSON, "queue %s: message %d has no data", queue, i+1)
	}
	return nil
}

// checkJSON checks that m's data (if it has no bytes) is JSON that PostgreSQL's jsonb
// takes.
func checkJSON(queue string, i int, m *OutgoingMessage) error {
	if m.Bytes != nil {
		return nil
	}
	if !json.Valid(m.Data) {
		return invalid(ErrInvalidJSON, "queue %s: message %d: data is not valid JSON", queue, i+1)
	}
	if why := pgtext.JSONProblem(m.Data); why != "" {
		return invalid(ErrInvalidJSON, "queue %s: message %d: data: %s", queue, i+1, why)
	}
	return nil
}

// firstJSONProblem returns checkJSON's error for the first of msgs (whose shapes
// checkShape passed) that has one, or nil; nil as well unless deferred (the caller
// checked them already).
func firstJSONProblem(queue string, msgs []OutgoingMessage, deferred bool) error {
	if !deferred {
		return nil
	}
	for i := range msgs {
		if err := checkJSON(queue, i, &msgs[i]); err != nil {
			return err
		}
	}
	return nil
}

// refusedJSON returns err, or, when it is jsonb's input function refusing a payload
// (not JSON, \u0000, text not valid in the database's encoding; nothing stored), an
// ErrInvalidJSON naming the first message the client's checks refuse, or wrapping err
// when they take them all (they should not: pgtext.JSONProblem refuses what jsonb does
// and json.Valid takes). Every statement of send goes through it, whichever path
// checked first.
func refusedJSON(queue string, msgs []OutgoingMessage, err error) error {
	switch sqlerr.Code(err) {
	case sqlerr.InvalidJSON, sqlerr.JSONUnsupportedEscape, sqlerr.InvalidEncoding:
		return cmp.Or(firstJSONProblem(queue, msgs, true), fmt.Errorf("%w: queue %s: %w", ErrInvalidJSON, queue, err))
	}
	return err
}

// checkOther checks m's ids, keys, headers and options.
func checkOther(queue string, i int, m *OutgoingMessage) error {
	if why := cmp.Or(pgtext.TextProblem(m.MessageID), pgtext.TextProblem(m.GroupKey)); why != "" {
		return invalid(ErrInvalidArgument, "queue %s: message %d: message id or group key: %s", queue, i+1, why)
	}
	for k, v := range m.Headers {
		if why := cmp.Or(pgtext.TextProblem(k), pgtext.TextProblem(v)); why != "" {
			return invalid(ErrInvalidArgument, "queue %s: message %d: header %q: %s", queue, i+1, k, why)
		}
	}
	if m.Delay < 0 {
		return invalid(ErrInvalidArgument, "queue %s: message %d: delay %v is negative", queue, i+1, m.Delay)
	}
	if m.Delay != 0 && !m.DeliverAt.IsZero() {
		return invalid(ErrInvalidArgument, "queue %s: message %d: set Delay or DeliverAt, not both", queue, i+1)
	}
	if m.MaxDeliveryAttempts < 0 {
		return invalid(ErrInvalidArgument, "queue %s: message %d: max delivery attempts %d is negative", queue, i+1, m.MaxDeliveryAttempts)
	}
	if m.MaxDeliveryAttempts > math.MaxInt32 {
		return invalid(ErrInvalidArgument, "queue %s: message %d: max delivery attempts %d exceeds %d", queue, i+1, m.MaxDeliveryAttempts, math.MaxInt32)
	}
	if len(m.MessageID) > 512 {
		return invalid(ErrInvalidArgument, "queue %s: message %d: message id is longer than 512 bytes", queue, i+1)
	}
	if m.DeadLetterQueue != "" && !ValidName(m.DeadLetterQueue) {
		return invalid(ErrInvalidName, "queue %s: message %d: dead-letter queue %q is not a valid queue name", queue, i+1, m.DeadLetterQueue)
	}
	return nil
}

// sendDirectSQL is the common send (ids made by the client, JSON data and nothing
// else, a standard queue) as one statement, prepared once per connection, instead of
// a call of queue_send: the function's call, its RETURN QUERY and the outer SELECT
// cost the server about a quarter of a send of 100, and this statement saves most of
// it (bench/RESULTS.md, "Issue 22, session 11"). It does what queue_send's common path
// does: queue_send_target takes the queue's lock and reads its row; t takes the
// batch's blocks of offsets from the queue's sequence (queue_offset_blocks: one
// nextval per offsetBlock messages, where one per message cost the server about 8% of
// the send; bench/RESULTS.md, "Issue 22, session 15"), and message i (from 0) gets
// block i / offsetBlock plus i % offsetBlock; a message over the queue's max payload
// (or without data) hands the batch to queue_send_check, which raises its typed
// error, so nothing is stored. A queue that does not exist, or is FIFO, gives t no
// row, so nothing is inserted or returned: the caller then calls queue_send. The
// time ($4, or the clock) and the tenant are read once, after the lock (the lateral
// subquery n runs once, for the queue's one row). The queue's name and limit are t's
// own columns: read from the row value (qr) they were taken apart at every message.
//
// The INSERT has no RETURNING, and the answer is t's blocks, one row: RETURNING
// would need SELECT on queue_messages, and a role granted only INSERT (a send-only
// producer, docs/tenants.md) can call queue_send, so it must be able to send this
// way too (TestSendOnlyRoleSends). A data-modifying WITH runs to its end whether or
// not the outer query reads it. A row per message cost the server 5–18% of the send
// in a probe (bench/RESULTS.md, "Issue 22, session 12"); the client expands the
// blocks as the insert does.
//
// This statement names queue_messages' columns: the layout is a contract of the
// client as well as of the functions (DESIGN.md, "The queue's storage").
const sendDirectSQL = `WITH t AS MATERIALIZED (
		SELECT q AS qr, q.queue_name AS qname, q.max_payload_bytes AS maxb, n.now, n.tenant,
		       streamd.queue_offset_blocks(q.offset_seq, cardinality($2::text[])) AS blocks
		FROM streamd.queue_send_target($1) q
		CROSS JOIN LATERAL (SELECT coalesce($4::timestamptz, clock_timestamp()) AS now,
		                           nullif(current_setting('streamd.tenant_id', true), '') AS tenant
		                    WHERE q.queue_name IS NOT NULL AND NOT q.fifo) n
	), ins AS (
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at,
			visibility_timeout, tenant_id)
		SELECT t.qname, t.blocks[(u.i - 1) / 128 + 1] + (u.i - 1) % 128,
		       CASE WHEN u.d IS NULL OR octet_length(u.d) > t.maxb
		            THEN streamd.queue_send_check(t.qr, $2, $3, NULL, NULL, NULL, NULL) ELSE u.id END,
		       u.d::jsonb, t.now, t.now, t.tenant
		FROM t CROSS JOIN LATERAL unnest($2::text[], $3::text[]) WITH ORDINALITY u(id, d, i)
	)
	SELECT t.blocks FROM t`

// offsetBlock is how many offsets one value of a queue's sequence reserves (its
// INCREMENT; streamd.queue_offset_blocks, migration 0205), the 128 of sendDirectSQL.
const offsetBlock = 128

// sendDirect sends the common batch with sendDirectSQL; ok is false when it stored
// nothing because the queue is missing or FIFO (the caller falls back on queue_send).
// ids are the client's fresh UUIDs: no dedup key, so no conflict to look for.
func (c *Client) sendDirect(ctx context.Context, db streams.DBTX, queue string, ids, data []string) ([]SendResult, bool, error) {
	var blocks []int64
	err := db.QueryRow(ctx, sendDirectSQL, queue, ids, data, c.sqlNow()).Scan(&blocks)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("send to queue %s: %w", queue, sqlerr.Wrap(err))
	}
	if len(blocks) != (len(ids)+offsetBlock-1)/offsetBlock {
		return nil, false, fmt.Errorf("send to queue %s: %d offset blocks for %d messages", queue, len(blocks), len(ids))
	}
	out := make([]SendResult, len(ids))
	for i, id := range ids {
		out[i] = SendResult{MessageID: id, Offset: blocks[i/offsetBlock] + int64(i%offsetBlock)}
	}
	return out, true, nil
}

// freshIDs returns n random (version 4) UUIDs as text, from one read of the random
// source for the batch instead of one per id.
func freshIDs(n int) []string {
	b := make([]byte, 16*n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	out := make([]string, n)
	for i := range out {
		var u uuid.UUID
		copy(u[:], b[16*i:])
		u[6] = u[6]&0x0f | 0x40 // version 4
		u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
		out[i] = u.String()
	}
	return out
}

// nilIfAllNil returns s, or nil (SQL NULL) when every element is nil.
func nilIfAllNil[T any](s []*T) []*T {
	for _, p := range s {
		if p != nil {
			return s
		}
	}
	return nil
}
