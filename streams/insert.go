package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

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

// insertSQL appends a batch of one partition in one statement, so in one round trip
// and one implicit transaction: streamd.append_reserve_row takes the offsets on the
// head row and marks the transaction trusted (the rows then skip the offset trigger,
// as COPY's do), and the INSERT writes the rows from arrays. The CTE is MATERIALIZED
// and every inserted row joins its one row, so the reservation runs, once, before the
// first row is inserted. The base comes back NULL when append_reserve_row declines
// the batch (a stream with per-key versions or enforced types, a payload over the
// limit): nothing was written, and the batch goes through streamd.append(). A
// duplicate event id fails the statement with a unique violation (no ON CONFLICT: a
// skipped row would leave a hole), and the batch goes through streamd.append(), which
// deduplicates (L4).
//
// The arrays are unnested in a target list (value per call), not in FROM, and the
// reservation is a plain function in a target list: a function in FROM materialises
// its rows in a tuplestore of its own, and the nine of the statement before (with the
// reservation's) cost a small batch two to three times the server CPU of a plain
// INSERT (sql/functions/0100_log.sql, append_reserve_row; bench/RESULTS.md).
const insertSQL = `WITH r AS MATERIALIZED (SELECT streamd.append_reserve_row($1, $2, $3, $4) AS h),
ins AS (
    INSERT INTO streamd.events (stream_name, partition, "offset", event_id, event_type, key, data, data_bytes,
                                metadata, "timestamp", correlation_id, causation_id, version)
    SELECT $1, $2, (r.h).base + u.i, u.e, u.t, u.k, u.d::jsonb, u.b, u.m::jsonb, (r.h).ts, u.c, u.ca, u.v
      FROM r, (SELECT unnest($5::text[]) AS e, unnest($6::text[]) AS t, unnest($7::text[]) AS k,
                      unnest($8::text[]) AS d, unnest($9::bytea[]) AS b, unnest($10::text[]) AS m,
                      unnest($11::text[]) AS c, unnest($12::text[]) AS ca, unnest($13::integer[]) AS v,
                      unnest($14::integer[]) AS i) u
     WHERE (r.h).base IS NOT NULL
    RETURNING 1)
SELECT (r.h).base, (r.h).ts, (SELECT count(*) FROM ins) FROM r`

// oneSQL is insertSQL's form for a single record: streamd.append_one reserves and
// inserts with scalar arguments, which costs the server less than receiving and
// unnesting arrays in a statement with a CTE (bench/RESULTS.md, issue 21 §2). OFFSET 0
// keeps the subquery, so the function runs once, not once per column taken from its
// result.
const oneSQL = `SELECT (a.h).base, (a.h).ts
FROM (SELECT streamd.append_one($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS h OFFSET 0) a`

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
		return insertStatement{sql: oneSQL, n: 1, args: []any{stream, partition, ids[0], types[0], keys[0], data[0], bin[0],
			meta[0], corr[0], caus[0], versions[0]}}, nil
	}
	return insertStatement{sql: insertSQL, n: n, args: []any{stream, partition, n, maxPayload,
		ids, types, keys, data, bin, meta, corr, caus, versions, ords}}, nil
}

// scan reads the statement's result from row and turns it into the positions of its
// records: ok=false, with nothing written, when the batch must take streamd.append()
// instead (declined, or a duplicate event id).
func (s insertStatement) scan(row pgx.Row, stream string, partition int32) (pos []Position, ok bool, err error) {
	var base pgtype.Int8
	var ts pgtype.Timestamptz
	count := int64(1)
	if s.n == 1 {
		err = row.Scan(&base, &ts)
	} else {
		err = row.Scan(&base, &ts, &count)
	}
	switch {
	case err == nil:
	case sqlerr.Code(err) == "23505": // a duplicate event id
		return nil, false, nil
	default:
		return nil, false, fmt.Errorf("append to %s: %w", stream, sqlerr.Wrap(err))
	}
	if !base.Valid { // declined: nothing reserved, nothing written
		return nil, false, nil
	}
	if count != int64(s.n) {
		return nil, false, fmt.Errorf("append to %s: %d rows inserted for %d records", stream, count, s.n)
	}
	insertAppends.Add(1)
	pos = make([]Position, s.n)
	for i := range pos {
		pos[i] = Position{Partition: partition, Offset: base.Int64 + int64(i), Timestamp: ts.Time}
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
