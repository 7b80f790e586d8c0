package streams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
)

// insertMax is the largest batch appended by insertSQL; larger one-partition batches
// take COPY, which encodes rows more cheaply than the arrays of one statement.
var insertMax = 256

// insertAppends counts batches appended by insertSQL (tests check the path was taken).
var insertAppends atomic.Int64

// insertSQL appends a batch of one partition in one statement the client prepares,
// so in one round trip and one implicit transaction, with no PL/pgSQL function of
// its own around it (session 12 replaced streamd.append_reserve_row and
// streamd.append_one, which the client no longer calls; bench/RESULTS.md, issue 21
// §2). In this order:
//   - r reads the stream's row and yields it only when the batch can take this path:
//     the stream exists, has the partition, is not read-only, keeps no per-key
//     versions and enforces no event types, and the largest payload ($4) is within
//     its limit. For that row it reserves the offsets through streamd.head_reserve
//     (SECURITY DEFINER: the appending role needs no write privilege on head rows),
//     which locks the head row until the transaction ends (L1) and takes the log time
//     from the clock under that lock (the clock rule); its base is NULL when the
//     partition is gone (the stream was deleted while this waited). OFFSET 0 keeps
//     the subquery, so head_reserve runs once, not once per field taken from it;
//   - t keeps a reservation that was made, re-checks the event sourcing settings
//     after the lock (streamd.append_recheck_rules, 40001 when they changed
//     meanwhile: a function, so it reads with a snapshot taken after the lock, where
//     this statement's own reads use the one taken before it waited) and marks the
//     transaction trusted, so the rows skip the offset trigger, as COPY's do;
//   - ins writes the rows from arrays unnested in a target list (no tuplestore per
//     array), each joined to t's one row. It has no RETURNING (that would need SELECT
//     on events) and the outer query does not read it, so PostgreSQL runs it when the
//     outer query is done, after t, whose row the outer query read: nothing is
//     written before the reservation and the mark.
//
// When r or t yields nothing, the statement returns no row and wrote nothing: the
// batch goes through streamd.append(), which raises the typed error the condition
// calls for (SD001, SD002, SD003, SD004, read-only) or appends on the event sourcing
// path. A duplicate event id fails the statement with a unique violation (no ON
// CONFLICT: a skipped row would leave a hole), and the batch goes through
// streamd.append(), which deduplicates and answers Duplicate (L4).
//
// The trusted mark stays on until the transaction ends: the statement runs in an
// implicit transaction of its own, or in a shared transaction of such statements only
// (coalesce.go), every row of which lies in offsets that transaction reserved.
//
// No row estimate depends on a parameter, so PostgreSQL keeps one generic plan per
// connection (TestOneStatementAppendKeepsAGenericPlan). The statement names events'
// and streams' columns: they are a contract of the client as well as of the SQL
// functions (docs/operations.md, "Client library").
var insertSQL = reserveCTE("$3", "$4") + `,
ins AS (
    INSERT INTO streamd.events (stream_name, partition, "offset", event_id, event_type, key, data, data_bytes,
                                metadata, "timestamp", correlation_id, causation_id, version)
    SELECT $1, $2, t.base + u.i, u.e, u.t, u.k, u.d::jsonb, u.b, u.m::jsonb, t.ts, u.c, u.ca, u.v
      FROM t, (SELECT unnest($5::text[]) AS e, unnest($6::text[]) AS t, unnest($7::text[]) AS k,
                      unnest($8::text[]) AS d, unnest($9::bytea[]) AS b, unnest($10::text[]) AS m,
                      unnest($11::text[]) AS c, unnest($12::text[]) AS ca, unnest($13::integer[]) AS v,
                      unnest($14::integer[]) AS i) u)
SELECT t.base, t.ts FROM t`

// oneSQL is insertSQL for a single record, with scalar parameters instead of arrays
// (none to receive and unnest): the same steps, checks and fallbacks (the same t).
var oneSQL = reserveCTE("1", "$3") + `,
ins AS (
    INSERT INTO streamd.events (stream_name, partition, "offset", event_id, event_type, key, data, data_bytes,
                                metadata, "timestamp", correlation_id, causation_id, version)
    SELECT $1, $2, t.base, $4, $5, $6, $7::text::jsonb, $8, $9::text::jsonb, t.ts, $10, $11, $12
      FROM t)
SELECT t.base, t.ts FROM t`

// reserveCTE is the CTE t of insertSQL and oneSQL, one text so that the two paths
// cannot check different things: count and maxPayload are the SQL (a parameter or a
// literal) of the batch's record count and its largest payload; $1 and $2 are the
// stream and the partition.
func reserveCTE(count, maxPayload string) string {
	return `WITH t AS MATERIALIZED (
    SELECT (r.h).base AS base, (r.h).ts AS ts, streamd.append_recheck_rules($1, false, false) AS recheck,
           set_config('streamd.append_trusted', 'on', true) AS trusted
      FROM (SELECT streamd.head_reserve($1, $2, ` + count + `) AS h FROM streamd.streams st
             WHERE st.stream_name = $1 AND $2 >= 0 AND $2 < st.partitions AND ` + maxPayload + ` <= st.max_payload_bytes
               AND NOT (st.read_only OR st.key_versions OR st.enforce_event_types) OFFSET 0) r
     WHERE (r.h).base IS NOT NULL)`
}

// insertStatement is the statement (oneSQL for a single record, insertSQL for more)
// and the arguments that append recs, all to stream and partition and all with an
// event id, in one round trip.
type insertStatement struct {
	sql  string
	args []any
	n    int
}

func newInsertStatement(stream string, partition int32, recs []Record) (insertStatement, error) {
	n := len(recs)
	maxPayload := 0
	ids := make([]string, n)
	types := make([]string, n)
	keys := make([]pgtype.Text, n)
	data := make([]pgtype.Text, n)
	bin := make([][]byte, n)
	meta := make([]pgtype.Text, n)
	corr := make([]pgtype.Text, n)
	caus := make([]pgtype.Text, n)
	versions := make([]int32, n)
	ords := make([]int32, n)
	for i := range recs {
		r := &recs[i]
		maxPayload = max(maxPayload, len(r.Data)+len(r.Bytes))
		ids[i], types[i] = r.EventID, r.EventType
		keys[i] = pgtype.Text{String: r.Key, Valid: r.Key != ""}
		if r.Data != nil {
			data[i] = pgtype.Text{String: string(r.Data), Valid: true}
		}
		bin[i] = r.Bytes
		if len(r.Headers) > 0 {
			b, err := json.Marshal(r.Headers)
			if err != nil {
				return insertStatement{}, fmt.Errorf("append to %s: encode headers: %w", stream, err)
			}
			meta[i] = pgtype.Text{String: string(b), Valid: true}
		}
		corr[i] = pgtype.Text{String: r.CorrelationID, Valid: r.CorrelationID != ""}
		caus[i] = pgtype.Text{String: r.CausationID, Valid: r.CausationID != ""}
		versions[i] = r.Version
		if versions[i] == 0 {
			versions[i] = 1
		}
		ords[i] = int32(i)
	}
	if n == 1 {
		return insertStatement{sql: oneSQL, n: 1, args: []any{stream, partition, maxPayload, ids[0], types[0], keys[0], data[0],
			bin[0], meta[0], corr[0], caus[0], versions[0]}}, nil
	}
	return insertStatement{sql: insertSQL, n: n, args: []any{stream, partition, n, maxPayload,
		ids, types, keys, data, bin, meta, corr, caus, versions, ords}}, nil
}

// scan reads the statement's result from row and turns it into the positions of its
// records: ok=false, with nothing written, when the batch must take streamd.append()
// instead (declined, or a duplicate event id).
func (s insertStatement) scan(row pgx.Row, stream string, partition int32) (pos []Position, ok bool, err error) {
	var base int64
	var ts time.Time
	err = row.Scan(&base, &ts)
	switch {
	case err == nil:
	case errors.Is(err, pgx.ErrNoRows): // declined: nothing reserved, nothing written
		return nil, false, nil
	case sqlerr.Code(err) == "23505": // a duplicate event id
		return nil, false, nil
	default:
		return nil, false, fmt.Errorf("append to %s: %w", stream, sqlerr.Wrap(err))
	}
	insertAppends.Add(1)
	pos = make([]Position, s.n)
	for i := range pos {
		pos[i] = Position{Partition: partition, Offset: base + int64(i), Timestamp: ts}
	}
	return pos, true, nil
}

// appendInsert appends recs, all to stream and partition and all with an event id,
// with insertSQL (oneSQL for a single record). It reports ok=false, having written
// nothing, when the batch must take streamd.append() instead (the cases of appendCopy,
// but for row-level security: an INSERT, unlike COPY, is subject to the policies).
func appendInsert(ctx context.Context, pool *pgxpool.Pool, stream string, partition int32, recs []Record) (pos []Position, ok bool, err error) {
	st, err := newInsertStatement(stream, partition, recs)
	if err != nil {
		return nil, false, err
	}
	return st.scan(pool.QueryRow(ctx, st.sql, st.args...), stream, partition)
}
