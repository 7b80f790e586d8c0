package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/streams"
)

// appendPathScenario compares, under the same concurrent load as the produce
// reference (most connections, largest batch, one partition per connection), the
// current append path with two prototypes that skip the plpgsql function:
//
//   - streamd: streams.Client.Produce, i.e. streamd.append();
//   - copy-append: one transaction of reserveSQL (head_reserve, trusted inserts)
//     and a COPY of the rows with their offsets into streamd.events. No dedup: a
//     duplicate event id fails the batch (a real path would fall back to append());
//   - insert-append: reserveSQL and INSERT ... SELECT FROM unnest(arrays) ON
//     CONFLICT (stream_name, event_id) DO NOTHING into streamd.events. Dedup skips
//     a duplicate but leaves an offset hole (append() closes such holes).
//
// The prototypes keep L1 (offsets from the locked head row, committed in offset
// order) and L2; they are measurements for the design, not an API.
type appendPathScenario struct{}

func init() { register(30, appendPathScenario{}) }

func (appendPathScenario) Name() string { return "appendpath" }

func (s appendPathScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	su := env.Suite
	conns, batch := maxInt(su.Conns), maxInt(su.BatchSizes)
	var out []Result
	for _, size := range su.Payloads {
		p := Params{PayloadBytes: size, BatchSize: batch, Conns: conns, Partitions: su.Partitions}
		// The COPY reference of this scenario, measured with its cases: first and
		// last, its rate their mean (see producerCopyRef).
		before, err := copyRef(ctx, env, "appendpath", p)
		if err != nil {
			return nil, err
		}
		var cases []Result
		for _, system := range []string{"streamd", "copy-append", "insert-append"} {
			r, err := s.run(ctx, env, system, p)
			if err != nil {
				return nil, err
			}
			if system == "streamd" {
				r.Target = produceTarget
			}
			cases = append(cases, r)
		}
		after, err := copyRef(ctx, env, "appendpath", p)
		if err != nil {
			return nil, err
		}
		ref := mergeRuns(before, after)
		ref.Note = fmt.Sprintf("COPY into the baseline table at this shape, measured before (%.0f records/s) and after (%.0f records/s) the scenario's cases; the mean of the two",
			before.RecordsPerSec, after.RecordsPerSec)
		for i := range cases {
			cases[i].RatioTo, cases[i].Ratio = ref.Case, ratio(cases[i].RecordsPerSec, ref.RecordsPerSec)
		}
		out = append(out, cases...)
		out = append(out, ref)
	}
	return out, nil
}

func (appendPathScenario) run(ctx context.Context, env *Env, system string, p Params) (Result, error) {
	stream := env.StreamName("appendpath", system, sizeLabel(p.PayloadBytes))
	if err := env.Client.CreateStream(ctx, stream, int32(p.Partitions)); err != nil {
		return Result{}, err
	}
	srcs := make([]*rowSource, p.Conns)
	recs := make([][]streams.Record, p.Conns)
	rows := make([][][]any, p.Conns)
	for w := range srcs {
		srcs[w] = newRowSource(env, stream, w, p.PayloadBytes)
	}
	load, err := env.measure(ctx, p.Conns, env.Suite.CaseDuration, func(ctx context.Context, w, iter int) (int, int, error) {
		part := int32((w + iter*p.Conns) % p.Partitions)
		src := srcs[w]
		var bytes int
		switch system {
		case "streamd":
			recs[w], bytes = src.records(recs[w], p.BatchSize, part, p.Partitions)
			_, err := env.Client.Produce(ctx, recs[w]...)
			return p.BatchSize, bytes, err
		case "copy-append":
			err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
				base, ts, err := reserveOffsets(ctx, tx, stream, part, p.BatchSize)
				if err != nil {
					return err
				}
				rows[w], bytes = src.copyRows(rows[w], p.BatchSize, part, base, ts)
				_, err = tx.CopyFrom(ctx, pgx.Identifier{"streamd", "events"}, copyColumns, pgx.CopyFromRows(rows[w]))
				return err
			})
			return p.BatchSize, bytes, err
		default: // insert-append
			err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
				base, ts, err := reserveOffsets(ctx, tx, stream, part, p.BatchSize)
				if err != nil {
					return err
				}
				var ids, keys, data []string
				ids, keys, data, bytes = rowArrays(src, p.BatchSize)
				_, err = tx.Exec(ctx, insertEventsSQL, stream, part, base, ts, ids, keys, data)
				return err
			})
			return p.BatchSize, bytes, err
		}
	})
	if err != nil {
		return Result{}, fmt.Errorf("appendpath %s: %w", system, err)
	}
	if err := dropStream(ctx, env, stream); err != nil {
		return Result{}, err
	}
	r := loadToResult("appendpath", system, false, p, load)
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}

// insertEventsSQL is insert-append's INSERT into streamd.events.
var insertEventsSQL = fmt.Sprintf(insertUnnestSQL, "streamd.events") + " ON CONFLICT (stream_name, event_id) DO NOTHING"

// reserveOffsets runs reserveSQL in tx: it advances the partition's head row by n
// and returns the first reserved offset and the batch's timestamp.
func reserveOffsets(ctx context.Context, tx pgx.Tx, stream string, part int32, n int) (int64, time.Time, error) {
	var set string
	var base int64
	var ts time.Time
	err := tx.QueryRow(ctx, reserveSQL, stream, part, int64(n)).Scan(&set, &base, &ts)
	return base, ts, err
}

// rowArrays returns the next n rows of src as the arrays insertUnnestSQL takes.
func rowArrays(src *rowSource, n int) (ids, keys, data []string, bytes int) {
	ids, keys, data = make([]string, n), make([]string, n), make([]string, n)
	for i := range ids {
		r, b := src.next()
		ids[i], keys[i], data[i] = r.eventID, r.key, string(r.data)
		bytes += b
	}
	return ids, keys, data, bytes
}
