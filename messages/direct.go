package messages

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// The common receive and ack of a standard queue as client statements on the queue's
// partition, named (issue 22, session 17: direct23; DESIGN.md, "The queue's storage").
// Through the parent, a generic plan locks every queue's partition before it prunes
// (PostgreSQL 15), so queue_receive and queue_ack plan at every call (custom plans),
// about 850 µs of server time per receive + ack of 100. A statement that names the
// partition has one table to plan for, and pgx prepares it once per connection and
// queue, so PostgreSQL keeps its generic plan. Each reads the queue's row through
// initplans (the FIFO flag, the lease, the attempts, the dead-letter queue), so a
// change of the queue's settings applies at once, and each declines to the function
// for what it does not do:
//
//   - a missing queue (its partition is missing: 42P01, or kept after its row went)
//     and a FIFO queue: the statement finds no queue row, leases or deletes nothing and
//     says so; the function then raises the typed error or does the FIFO work;
//   - a receive that meets a message due for its dead-letter queue (its attempts used
//     up, a standard queue of its dead-letter name existing): it leases nothing and
//     says so, and queue_receive moves the message and leases the rest.
//
// The partition's name (queue_messages_<md5 of the queue name>, migration 0215) is a
// contract of the client, as queue_messages' columns are for sendDirectSQL.
//
// Unlike the functions, these statements cannot run with enable_seqscan and the
// other planner settings off: their plans are the planner's choice, and on a small
// partition the generic plan scans it (the lane, the lease by ctid) until an
// invalidation makes it again. A spike, not landed for that among other things
// (bench/RESULTS.md, "Issue 22, session 17 (direct23)").

// partitionIdent is the quoted name of queue's partition of streamd.queue_messages.
func partitionIdent(queue string) string {
	sum := md5.Sum([]byte(queue))
	return pgx.Identifier{"streamd", "queue_messages_" + hex.EncodeToString(sum[:])}.Sanitize()
}

// receiveDirectSQL leases up to $2 messages of queue $1's partition (@P@), as
// queue_receive does for a standard queue: due messages of the delayed lane first,
// then the main range in offset order, locked SKIP LOCKED, one LIMIT over both; each
// gets attempt + 1, the lease's end ($3 ms, or the queue's, from the time $4 or the
// clock) and its lease token: the client's random eight bytes $5 followed by its
// random eight $6 XORed with the message's offset (queue_receive's token, with the
// random half drawn by the client instead of gen_random_uuid()). It answers
// queue_receive's columns, plus one row of offset -1 when it declined: no standard
// queue of the name, or a locked candidate due for its dead-letter queue (then nothing
// is leased, and the locks go with the statement's implicit transaction).
//
// The queue's values are initplans (q, read once), not a join: joined to the queue's
// row, the locking scans cost the drain 12–27% more server CPU (bench/RESULTS.md,
// "Issue 22, session 17 (layout23)"). $2 is read through an initplan too, so the
// generic plan and a custom one are costed alike and the plan cache keeps the generic
// one (queue13's trap: bench/RESULTS.md, "Session 13"; TestDirectStatementsKeepGenericPlans).
const receiveDirectSQL = `WITH q AS MATERIALIZED (
		SELECT q.visibility_timeout_ms AS vt, q.max_delivery_attempts AS att, q.dead_letter_queue AS dlq,
		       coalesce($4::timestamptz, clock_timestamp()) AS now, $2::integer AS lim
		FROM streamd.queues q WHERE q.queue_name = $1 AND NOT q.fifo),
	c AS MATERIALIZED (
		SELECT c.ctid, c.exhausted FROM (
			(SELECT * FROM (SELECT x.ctid,
			        CASE WHEN x.delivery_attempts >= coalesce(x.max_delivery_attempts, (SELECT q.att FROM q))
			             THEN streamd.queue_dlq_ok(coalesce(x.dead_letter_stream, (SELECT q.dlq FROM q))) ELSE false END AS exhausted
			 FROM @P@ x
			 WHERE x."offset" >= 4503599627370496 AND x.due_at <= (SELECT q.now FROM q)
			   AND x.visibility_timeout <= (SELECT q.now FROM q)
			 ORDER BY x.due_at LIMIT (SELECT q.lim FROM q) FOR UPDATE SKIP LOCKED) lane)
			UNION ALL
			(SELECT * FROM (SELECT x.ctid,
			        CASE WHEN x.delivery_attempts >= coalesce(x.max_delivery_attempts, (SELECT q.att FROM q))
			             THEN streamd.queue_dlq_ok(coalesce(x.dead_letter_stream, (SELECT q.dlq FROM q))) ELSE false END AS exhausted
			 FROM @P@ x
			 WHERE x."offset" < 4503599627370496 AND x.visibility_timeout <= (SELECT q.now FROM q)
			 ORDER BY x."offset" LIMIT (SELECT q.lim FROM q) FOR UPDATE SKIP LOCKED) head)
			LIMIT (SELECT q.lim FROM q)) c),
	u AS (
		UPDATE @P@ m
		SET delivery_attempts = m.delivery_attempts + 1,
		    visibility_timeout = (SELECT q.now + coalesce($3::bigint, q.vt) * interval '1 millisecond' FROM q),
		    lease_token = encode($5::bytea || int8send($6::bigint # m."offset"), 'hex')::uuid
		WHERE m.ctid = ANY(ARRAY(SELECT c.ctid FROM c)) AND NOT EXISTS (SELECT 1 FROM c WHERE c.exhausted)
		RETURNING m."offset", m.message_id, m.data, m.metadata, m.enqueued_at, m.visibility_timeout,
		          m.delivery_attempts, coalesce(m.max_delivery_attempts, (SELECT q.att FROM q)), m.lease_token,
		          m.group_key, m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at,
		          m.data_bytes)
	SELECT * FROM u
	UNION ALL
	SELECT -1::bigint, '', NULL::jsonb, NULL::jsonb, now(), now(), 0, 0, NULL::uuid, NULL::text, NULL::text,
	       NULL::text, NULL::bigint, NULL::integer, NULL::timestamptz, NULL::bytea
	WHERE NOT EXISTS (SELECT 1 FROM q) OR EXISTS (SELECT 1 FROM c WHERE c.exhausted)`

// ackDirectSQL deletes the messages of queue $1's partition (@P@) named by the
// receipts ($2 offsets, $3 tokens; $5 and $6 their least and greatest offset), as
// queue_ack's range delete does, and answers as ackSQL does ($4: how many receipts),
// plus whether the queue is a standard queue (false: nothing was deleted, and the
// caller declines to queue_ack). The range and the name are initplans for the plan
// cache's sake, as in receiveDirectSQL.
const ackDirectSQL = `WITH q AS MATERIALIZED (
		SELECT $5::bigint AS lo, $6::bigint AS hi FROM streamd.queues q WHERE q.queue_name = $1 AND NOT q.fifo),
	d AS (
		DELETE FROM @P@ m
		WHERE m."offset" BETWEEN (SELECT q.lo FROM q) AND (SELECT q.hi FROM q)
		  AND m."offset" + 0 = ANY($2::bigint[]) AND m.lease_token = ANY($3::uuid[])
		RETURNING m."offset", m.lease_token)
	SELECT count(*), CASE WHEN count(*) < $4 THEN array_agg(d."offset") END,
	       CASE WHEN count(*) < $4 THEN array_agg(d.lease_token) END, EXISTS (SELECT 1 FROM q)
	FROM d`

// ackDirectSpread is how far apart a direct ack's receipts may be: farther, and the
// range walk reads too much of the key (queue_ack takes a descent per offset then),
// so the ack declines to queue_ack.
func ackDirectSpread(n int) int64 { return 4*int64(n) + 64 }

// directStatements is a queue's receiveDirectSQL and ackDirectSQL with its partition's
// name put in.
type directStatements struct{ receive, ack string }

// directCache keeps the statements of the queues a process used last, so that a call
// neither hashes the name nor copies 3 KB of SQL; it is emptied when it holds
// directCacheMax.
var directCache = struct {
	sync.Mutex
	m map[string]*directStatements
}{m: map[string]*directStatements{}}

const directCacheMax = 1024

// direct returns queue's direct statements.
func direct(queue string) *directStatements {
	directCache.Lock()
	defer directCache.Unlock()
	if d, ok := directCache.m[queue]; ok {
		return d
	}
	if len(directCache.m) >= directCacheMax {
		clear(directCache.m)
	}
	p := partitionIdent(queue)
	d := &directStatements{strings.ReplaceAll(receiveDirectSQL, "@P@", p), strings.ReplaceAll(ackDirectSQL, "@P@", p)}
	directCache.m[queue] = d
	return d
}

// noPartition reports whether err is a statement's missing table: the queue's
// partition, so the queue, is missing.
func noPartition(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// receiveDirect leases up to max messages of queue with receiveDirectSQL on conn; ok
// is false when it leased nothing because it declined (the caller calls
// queue_receive).
func (c *Client) receiveDirect(ctx context.Context, db streams.DBTX, queue string, max int, vt *int64) ([]*Message, bool, error) {
	var tok [16]byte
	_, _ = rand.Read(tok[:])    // crypto/rand.Read never fails
	tok[6] = tok[6]&0x0f | 0x40 // version 4
	tok[8] = tok[8]&0x3f | 0x80 // RFC 4122 variant
	rows, err := db.Query(ctx, direct(queue).receive, queue, max, vt, c.sqlNow(),
		tok[:8], int64(binary.BigEndian.Uint64(tok[8:])))
	if err != nil {
		if noPartition(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("receive from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	defer rows.Close()
	var out []*Message
	declined := false
	for rows.Next() {
		m, err := scanMessage(rows, queue, true)
		if err != nil {
			return nil, false, fmt.Errorf("receive from queue %s: %w", queue, err)
		}
		if m.Offset < 0 {
			declined = true
			continue
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		if noPartition(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("receive from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	if declined {
		return nil, false, nil
	}
	return out, true, nil
}

// ackDirect acks rs, receipts of queue, with ackDirectSQL; ok is false when it
// deleted nothing because it declined (the caller calls queue_ack). In a caller's
// transaction (pool false), a missing partition is ErrQueueNotFound, as queue_ack
// would raise: the failed statement has aborted the transaction, so there is no
// declining.
func (c *Client) ackDirect(ctx context.Context, db streams.DBTX, pool bool, queue string, rs []Receipt) (map[receiptKey]bool, bool, error) {
	lo, hi := rs[0].Offset, rs[0].Offset
	for _, r := range rs {
		lo, hi = min(lo, r.Offset), max(hi, r.Offset)
	}
	if hi-lo >= ackDirectSpread(len(rs)) {
		return nil, false, nil
	}
	offs, toks := receiptArrays(rs)
	var (
		n      int64
		sOffs  []int64
		sToks  [][16]byte
		queued bool
	)
	err := db.QueryRow(ctx, direct(queue).ack, queue, offs, toks, len(rs), lo, hi).Scan(&n, &sOffs, &sToks, &queued)
	switch {
	case err != nil && noPartition(err) && pool:
		return nil, false, nil
	case err != nil && noPartition(err):
		return nil, false, fmt.Errorf("ack on queue %s: %w: queue %q does not exist", queue, ErrQueueNotFound, queue)
	case err != nil:
		return nil, false, fmt.Errorf("ack on queue %s: %w", queue, sqlerr.Wrap(err))
	case !queued:
		return nil, false, nil
	}
	return missedReceipts(rs, n, sOffs, sToks), true, nil
}
