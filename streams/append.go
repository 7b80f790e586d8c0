package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/streamd/streamd/internal/sqlerr"
)

type streamGroup struct {
	stream  string
	records []Record
	index   []int // position of each record in the caller's slice
}

func groupByStream(records []Record) []streamGroup {
	if len(records) > 0 {
		same := true
		for i := range records {
			if records[i].Stream != records[0].Stream {
				same = false
				break
			}
		}
		if same {
			idx := make([]int, len(records))
			for i := range idx {
				idx[i] = i
			}
			return []streamGroup{{stream: records[0].Stream, records: records, index: idx}}
		}
	}
	byName := map[string]*streamGroup{}
	var names []string
	for i, r := range records {
		g, ok := byName[r.Stream]
		if !ok {
			g = &streamGroup{stream: r.Stream}
			byName[r.Stream] = g
			names = append(names, r.Stream)
		}
		g.records = append(g.records, r)
		g.index = append(g.index, i)
	}
	sort.Strings(names)
	out := make([]streamGroup, len(names))
	for i, n := range names {
		out[i] = *byName[n]
	}
	return out
}

const appendSQL = `SELECT ord, partition, "offset", "timestamp", duplicate
FROM streamd.append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

// appendBatch appends records (all of one stream) with one call of streamd.append and
// returns their positions in order. Arrays whose elements would all be NULL are sent
// as NULL.
func appendBatch(ctx context.Context, db DBTX, stream string, records []Record) ([]Position, error) {
	n := len(records)
	var (
		parts    []pgtype.Int4
		ids      = make([]pgtype.Text, n)
		types    []pgtype.Text
		keys     []pgtype.Text
		data     []pgtype.Text
		bin      [][]byte
		meta     []pgtype.Text
		corr     []pgtype.Text
		caus     []pgtype.Text
		versions []pgtype.Int4
	)
	for i := range records {
		r := &records[i]
		if r.Partition != nil {
			if parts == nil {
				parts = make([]pgtype.Int4, n)
			}
			parts[i] = pgtype.Int4{Int32: *r.Partition, Valid: true}
		}
		// A record without an id gets one here rather than streamd.append's random
		// default: a UUIDv7, ordered by time (newEventID).
		id := r.EventID
		if id == "" {
			id = newEventID()
		}
		ids[i] = pgtype.Text{String: id, Valid: true}
		setText(&types, n, i, r.EventType)
		setText(&keys, n, i, r.Key)
		if r.Data != nil {
			setText(&data, n, i, string(r.Data))
		}
		if r.Bytes != nil {
			if bin == nil {
				bin = make([][]byte, n)
			}
			bin[i] = r.Bytes
		}
		if len(r.Headers) > 0 {
			b, err := json.Marshal(r.Headers)
			if err != nil {
				return nil, fmt.Errorf("append to %s: encode headers: %w", stream, err)
			}
			setText(&meta, n, i, string(b))
		}
		setText(&corr, n, i, r.CorrelationID)
		setText(&caus, n, i, r.CausationID)
		if r.Version != 0 {
			if versions == nil {
				versions = make([]pgtype.Int4, n)
			}
			versions[i] = pgtype.Int4{Int32: r.Version, Valid: true}
		}
	}
	rows, err := db.Query(ctx, appendSQL, stream, parts, ids, types, keys, data, bin, meta, corr, caus, versions)
	if err != nil {
		return nil, fmt.Errorf("append to %s: %w", stream, sqlerr.Wrap(err))
	}
	defer rows.Close()
	out := make([]Position, n)
	got := 0
	for rows.Next() {
		var ord int32
		var p Position
		if err := rows.Scan(&ord, &p.Partition, &p.Offset, &p.Timestamp, &p.Duplicate); err != nil {
			return nil, fmt.Errorf("append to %s: %w", stream, err)
		}
		if ord < 1 || int(ord) > n {
			return nil, fmt.Errorf("append to %s: server returned position for record %d of %d", stream, ord, n)
		}
		out[ord-1] = p
		got++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("append to %s: %w", stream, sqlerr.Wrap(err))
	}
	if got != n {
		return nil, fmt.Errorf("append to %s: server returned %d positions for %d records", stream, got, n)
	}
	return out, nil
}

func setText(dst *[]pgtype.Text, n, i int, v string) {
	if v == "" {
		return
	}
	if *dst == nil {
		*dst = make([]pgtype.Text, n)
	}
	(*dst)[i] = pgtype.Text{String: v, Valid: true}
}
