// Package queuebaseline holds the raw-PostgreSQL queues that the queue benchmarks
// measure streamd against, so that messages.BenchmarkQueueThroughput and the bench
// suite's queue scenario run the same statements:
//
//   - raw: a plain table drained with DELETE ... RETURNING, the floor any queue pays
//     (a message is gone once read: no lease);
//   - pgmq: pgmq's table (msg_id, read_ct, enqueued_at, vt indexed, message) and its
//     calls, read with a lease (vt) then deleted, one row at a time or in batches (its
//     read with qty, its delete of msg_ids[]).
//
// The locking subqueries are written id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP
// LOCKED)), an InitPlan run once whatever the statistics. Written id IN (SELECT ...),
// the planner sometimes re-ran the locking subquery after autovacuum analysed an
// emptied table, and every drain stalled for about 5 s.
//
// In every statement, %s is the table's quoted name.
package queuebaseline

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// RawTable creates the raw queue's table.
	RawTable = `CREATE TABLE %s (id bigserial PRIMARY KEY, payload jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`
	// RawSend stores one batch ($1: the payloads, text[]).
	RawSend = `INSERT INTO %s (payload) SELECT p::jsonb FROM unnest($1::text[]) p`
	// RawDrain takes and deletes up to $1 messages, returning them.
	RawDrain = `DELETE FROM %s WHERE id = ANY(ARRAY(SELECT id FROM %[1]s ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
		RETURNING id, payload`

	// PgmqTable creates pgmq's table and its index on vt.
	PgmqTable = `CREATE TABLE %s (msg_id bigserial PRIMARY KEY, read_ct int NOT NULL DEFAULT 0,
		enqueued_at timestamptz NOT NULL DEFAULT now(), vt timestamptz NOT NULL DEFAULT now(), message jsonb NOT NULL);
		CREATE INDEX ON %[1]s (vt)`
	// PgmqSend stores one batch ($1: the payloads, text[]).
	PgmqSend = `INSERT INTO %s (message) SELECT p::jsonb FROM unnest($1::text[]) p`
	// PgmqReadOne leases one visible message for 30 s.
	PgmqReadOne = `UPDATE %s SET vt = now() + interval '30 seconds', read_ct = read_ct + 1
		WHERE msg_id = (SELECT msg_id FROM %[1]s WHERE vt <= now() ORDER BY msg_id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING msg_id, message`
	// PgmqRead leases up to $1 visible messages for 30 s.
	PgmqRead = `UPDATE %s SET vt = now() + interval '30 seconds', read_ct = read_ct + 1
		WHERE msg_id = ANY(ARRAY(SELECT msg_id FROM %[1]s WHERE vt <= now() ORDER BY msg_id LIMIT $1 FOR UPDATE SKIP LOCKED))
		RETURNING msg_id, message`
	// PgmqDeleteOne deletes message $1.
	PgmqDeleteOne = `DELETE FROM %s WHERE msg_id = $1`
	// PgmqDelete deletes the messages $1 (bigint[]).
	PgmqDelete = `DELETE FROM %s WHERE msg_id = ANY($1)`
)

// DB is what the baselines run on (a *pgxpool.Pool).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Send stores payloads in table with send (RawSend or PgmqSend).
func Send(ctx context.Context, db DB, send, table string, payloads []string) error {
	_, err := db.Exec(ctx, fmt.Sprintf(send, table), payloads)
	return err
}

// DrainRaw takes up to n messages from the raw queue table and returns how many it
// got and their payload bytes (0 when the queue is empty).
func DrainRaw(ctx context.Context, db DB, table string, n int) (msgs, bytes int, err error) {
	rows, err := db.Query(ctx, fmt.Sprintf(RawDrain, table), n)
	if err != nil {
		return 0, 0, err
	}
	_, msgs, bytes, err = scanIDs(rows)
	return msgs, bytes, err
}

// ReadDeletePgmq leases up to n messages of pgmq's table in one statement, then
// deletes them by id array; it returns how many it got and their payload bytes.
func ReadDeletePgmq(ctx context.Context, db DB, table string, n int) (msgs, bytes int, err error) {
	rows, err := db.Query(ctx, fmt.Sprintf(PgmqRead, table), n)
	if err != nil {
		return 0, 0, err
	}
	ids, msgs, bytes, err := scanIDs(rows)
	if err != nil || msgs == 0 {
		return 0, 0, err
	}
	_, err = db.Exec(ctx, fmt.Sprintf(PgmqDelete, table), ids)
	return msgs, bytes, err
}

// ReadDeletePgmqOne leases one message of pgmq's table, then deletes it, a round trip
// each; it returns 1 and its payload bytes, or 0 when the queue is empty.
func ReadDeletePgmqOne(ctx context.Context, db DB, table string) (msgs, bytes int, err error) {
	var id int64
	var payload []byte
	err = db.QueryRow(ctx, fmt.Sprintf(PgmqReadOne, table)).Scan(&id, &payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	_, err = db.Exec(ctx, fmt.Sprintf(PgmqDeleteOne, table), id)
	return 1, len(payload), err
}

// scanIDs reads (id, payload) rows: the payloads are handed over as bytes, as
// streamd's client hands over a message's data.
func scanIDs(rows pgx.Rows) (ids []int64, msgs, bytes int, err error) {
	defer rows.Close()
	for rows.Next() {
		var id int64
		var payload []byte
		if err := rows.Scan(&id, &payload); err != nil {
			return nil, 0, 0, err
		}
		ids = append(ids, id)
		bytes += len(payload)
	}
	return ids, len(ids), bytes, rows.Err()
}
