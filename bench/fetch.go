package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/streamd/streamd/streams"
)

// fetchScenario measures streams.Client.Fetch reading a whole partition in batches
// against a raw primary-key range read loop of the same columns, on streamd.events
// (the same rows) and on the baseline copy table (identical rows written by COPY).
// Each reader first reads the partition once to warm the cache and set hint bits;
// then it reads for the case duration, wrapping to offset 0 at the end.
type fetchScenario struct{}

func init() { register(40, fetchScenario{}) }

func (fetchScenario) Name() string { return "fetch" }

// fetchTarget is issue 2's goal: Fetch ≥ 0.7× the raw range read.
const fetchTarget = 0.7

// rawFetchSQL is the baseline read: the primary-key range scan Fetch does, without
// the head-row join and without building events.
const rawFetchSQL = `SELECT "offset", event_id, event_type, key, data, data_bytes, metadata, "timestamp",
       correlation_id, causation_id, version
  FROM %s WHERE stream_name = $1 AND partition = $2 AND "offset" >= $3 ORDER BY "offset" LIMIT $4`

func (s fetchScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	var out []Result
	for _, size := range env.Suite.Payloads {
		n := env.Suite.FetchRecords[size]
		if n <= 0 {
			continue
		}
		rs, err := s.runSize(ctx, env, size, n)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

func (s fetchScenario) runSize(ctx context.Context, env *Env, size, n int) ([]Result, error) {
	stream := env.StreamName("fetch", sizeLabel(size))
	if err := env.Client.CreateStream(ctx, stream, 1); err != nil {
		return nil, err
	}
	defer func() { _ = dropStream(ctx, env, stream) }()
	t0 := time.Now()
	if err := s.load(ctx, env, stream, size, n); err != nil {
		return nil, err
	}
	env.Logger.Info("fetch: loaded", "stream", stream, "records", n, "seconds", time.Since(t0).Seconds())

	batch := env.Suite.FetchBatch
	p := Params{PayloadBytes: size, BatchSize: batch, Conns: 1, Partitions: 1}
	readers := []fetchReader{
		{"streamd", false, streamdReader(env, stream, batch)},
		{"raw-select", true, rawReader(env, "streamd.events", stream, batch)},
		{"raw-select-copy", true, rawReader(env, copyTable.Sanitize(), stream, batch)},
	}
	out, err := fetchCases(ctx, env, "fetch", p, n, readers)
	if err != nil {
		return nil, err
	}
	ref := out[1].Case
	setRatios(out, ref, "streamd", fetchTarget)
	out[2].RatioTo, out[2].Ratio = ref, ratio(out[2].RecordsPerSec, out[1].RecordsPerSec)
	if err := truncateCopy(context.WithoutCancel(ctx), env.Pool); err != nil {
		return nil, err
	}
	return out, nil
}

// fetchReader is one way of reading partition 0 of a stream from an offset: read
// returns the records and payload bytes it read.
type fetchReader struct {
	system   string
	baseline bool
	read     func(ctx context.Context, off int64) (int, int, error)
}

// streamdReader returns a reader that calls streams.Client.Fetch.
func streamdReader(env *Env, stream string, batch int) func(ctx context.Context, off int64) (int, int, error) {
	return func(ctx context.Context, off int64) (int, int, error) {
		res, err := env.Client.Fetch(ctx, stream, 0, off, &streams.FetchOpts{MaxRecords: batch, MaxBytes: 64 << 20})
		if err != nil {
			return 0, 0, err
		}
		b := 0
		for i := range res.Events {
			b += res.Events[i].Size()
		}
		return len(res.Events), b, nil
	}
}

// fetchCases runs each reader in turn over a partition of n records: one unmeasured
// warm-up pass, then reads for the case duration, wrapping to offset 0 at the end. It
// returns one result of scenario per reader, in order, without ratios.
func fetchCases(ctx context.Context, env *Env, scenario string, p Params, n int, readers []fetchReader) ([]Result, error) {
	var out []Result
	for _, rd := range readers {
		// Warm-up pass: cache and hint bits, not measured.
		for off := int64(0); off < int64(n); {
			k, _, err := rd.read(ctx, off)
			if err != nil {
				return nil, fmt.Errorf("%s %s warm-up: %w", scenario, rd.system, err)
			}
			if k == 0 {
				return nil, fmt.Errorf("%s %s warm-up: no records at offset %d of %d", scenario, rd.system, off, n)
			}
			off += int64(k)
		}
		var off int64
		load, err := env.measure(ctx, 1, env.Suite.CaseDuration, func(ctx context.Context, _, _ int) (int, int, error) {
			k, b, err := rd.read(ctx, off)
			if err != nil {
				return 0, 0, err
			}
			if k == 0 {
				return 0, 0, fmt.Errorf("no records at offset %d of %d", off, n)
			}
			if off += int64(k); off >= int64(n) {
				off = 0
			}
			return k, b, nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", scenario, rd.system, err)
		}
		r := loadToResult(scenario, rd.system, rd.baseline, p, load)
		env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
		out = append(out, r)
	}
	return out, nil
}

// load appends n records to partition 0 of stream with streamd (batches of 1000) and
// COPYs the same rows into the empty baseline table.
func (fetchScenario) load(ctx context.Context, env *Env, stream string, size, n int) error {
	if err := loadFetchStream(ctx, env, stream, size, n); err != nil {
		return err
	}
	if err := truncateCopy(ctx, env.Pool); err != nil {
		return err
	}
	const batch = 1000
	src := newRowSource(env, stream, 0, size)
	var rows [][]any
	for done := 0; done < n; done += batch {
		rows, _ = src.copyRows(rows, min(batch, n-done), 0, int64(done), time.Now())
		if err := copyBatch(ctx, env.Pool, rows); err != nil {
			return fmt.Errorf("load baseline: %w", err)
		}
	}
	_, err := env.Pool.Exec(ctx, "ANALYZE streamd_bench.events_copy")
	return err
}

// loadFetchStream appends n records of size bytes to partition 0 of stream with
// streams.Client.Produce, in batches of 1000.
func loadFetchStream(ctx context.Context, env *Env, stream string, size, n int) error {
	const batch = 1000
	src := newRowSource(env, stream, 0, size)
	var recs []streams.Record
	for done := 0; done < n; done += batch {
		recs, _ = src.records(recs, min(batch, n-done), 0, 1)
		if _, err := env.Client.Produce(ctx, recs...); err != nil {
			return fmt.Errorf("load %s: %w", stream, err)
		}
	}
	return nil
}

// rawReader returns a reader that runs the baseline range query on table and scans
// every column into Go values, as Fetch does.
func rawReader(env *Env, table, stream string, batch int) func(ctx context.Context, off int64) (int, int, error) {
	sql := fmt.Sprintf(rawFetchSQL, table)
	return func(ctx context.Context, off int64) (int, int, error) {
		rows, err := env.Pool.Query(ctx, sql, stream, int32(0), off, batch)
		if err != nil {
			return 0, 0, err
		}
		defer rows.Close()
		k, b := 0, 0
		for rows.Next() {
			var (
				o               int64
				id, typ         string
				key, corr, caus *string
				data, bin, meta []byte
				ts              time.Time
				version         int32
			)
			if err := rows.Scan(&o, &id, &typ, &key, &data, &bin, &meta, &ts, &corr, &caus, &version); err != nil {
				return 0, 0, err
			}
			_ = json.RawMessage(data)
			k++
			b += len(data) + len(bin)
			if key != nil {
				b += len(*key)
			}
		}
		return k, b, rows.Err()
	}
}
