package bench

import (
	"context"
	"fmt"

	"github.com/streamd/streamd/streams"
)

// readIndexScenario measures what a stream's read indexes (issue 20, point 6:
// streams.Client.EnableReadIndex) cost the append path: the produce reference load
// (most connections, largest batch, one partition per connection), every record with
// a correlation id, against a stream without read indexes ("append-no-read-index",
// the ratio's baseline) and one with both the correlation_id and event_type indexes
// ("append-read-index"). Each index adds one entry per appended event, on the
// opted-in stream only.
type readIndexScenario struct{}

func init() { register(31, readIndexScenario{}) }

func (readIndexScenario) Name() string { return "readindex" }

func (s readIndexScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	su := env.Suite
	conns, batch := maxInt(su.Conns), maxInt(su.BatchSizes)
	var out []Result
	for _, size := range su.Payloads {
		p := Params{PayloadBytes: size, BatchSize: batch, Conns: conns, Partitions: su.Partitions}
		base, err := s.run(ctx, env, "append-no-read-index", p, false)
		if err != nil {
			return nil, err
		}
		with, err := s.run(ctx, env, "append-read-index", p, true)
		if err != nil {
			return nil, err
		}
		with.RatioTo = base.Case
		out = append(out, base, with)
	}
	return out, nil
}

func (readIndexScenario) run(ctx context.Context, env *Env, system string, p Params, indexed bool) (Result, error) {
	stream := env.StreamName("readindex", system, sizeLabel(p.PayloadBytes))
	if err := env.Client.CreateStream(ctx, stream, int32(p.Partitions)); err != nil {
		return Result{}, err
	}
	if indexed {
		for _, k := range []streams.ReadIndex{streams.ReadIndexCorrelationID, streams.ReadIndexEventType} {
			if err := env.Client.EnableReadIndex(ctx, stream, k); err != nil {
				return Result{}, err
			}
		}
	}
	srcs := make([]*rowSource, p.Conns)
	recs := make([][]streams.Record, p.Conns)
	for w := range srcs {
		srcs[w] = newRowSource(env, stream, w, p.PayloadBytes)
	}
	load, err := env.measure(ctx, p.Conns, env.Suite.CaseDuration, func(ctx context.Context, w, iter int) (int, int, error) {
		part := int32((w + iter*p.Conns) % p.Partitions)
		var bytes int
		recs[w], bytes = srcs[w].records(recs[w], p.BatchSize, part, p.Partitions)
		for i := range recs[w] {
			// A correlation id shared by a few records, as a saga's events are.
			recs[w][i].CorrelationID = fmt.Sprintf("c-%d-%d-%d", w, iter, i/8)
		}
		_, err := env.Client.Produce(ctx, recs[w]...)
		return p.BatchSize, bytes, err
	})
	if err != nil {
		return Result{}, fmt.Errorf("readindex %s: %w", system, err)
	}
	if err := dropStream(ctx, env, stream); err != nil {
		return Result{}, err
	}
	r := loadToResult("readindex", system, false, p, load)
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}
