package consumergroup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// batchRecord is one handler call, as the invariant suite logs it.
type batchRecord struct {
	partition   int32
	first, last int64
	member      string
	epoch       int64
	start, end  time.Time
	ok          bool
}

// TestGroupInvariants: members join, leave cleanly and are killed (no leave, no
// hooks: as if the process died) at random while a producer appends. Checked:
// every record is handled at least once; committed offsets never decrease; no
// partition is handled by two members at the same time; every committed offset was
// committed by the member that handled the batch ending there (no fenced or foreign
// commit accepted); the lag reaches zero at the end.
//
// Fixed seed and ~8s by default; STREAMD_SOAK=1 uses a random seed (logged) and
// STREAMD_SOAK_DURATION (default 2m).
func TestGroupInvariants(t *testing.T) {
	t.Parallel()
	seed, duration := uint64(42), 8*time.Second
	if os.Getenv("STREAMD_SOAK") == "1" {
		seed, duration = uint64(time.Now().UnixNano()), 2*time.Minute
		if d, err := time.ParseDuration(os.Getenv("STREAMD_SOAK_DURATION")); err == nil {
			duration = d
		}
	}
	t.Logf("seed %d, duration %v", seed, duration)
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()
	pool := testdb.Pool(t)
	const partitions = 6
	stream := newStream(t, pool, partitions)
	group := testdb.Name("g")

	var mu sync.Mutex
	var log []batchRecord
	handler := func(ctx context.Context, b *Batch) error {
		r := batchRecord{partition: b.Partition, first: b.Events[0].Offset, last: b.Events[len(b.Events)-1].Offset,
			member: b.MemberID, epoch: b.MemberEpoch, start: time.Now()}
		// Simulated work that, like much real work, does not stop when ctx is
		// cancelled: a member must not lose a partition while this runs.
		time.Sleep(time.Duration(len(b.Events)) * 2 * time.Millisecond)
		err := ctx.Err()
		r.end, r.ok = time.Now(), err == nil
		mu.Lock()
		log = append(log, r)
		mu.Unlock()
		return err
	}

	// The producer appends small batches until told to stop.
	var produced []streams.Position
	stopProducing := make(chan struct{})
	producerDone := make(chan struct{})
	prng := rand.New(rand.NewPCG(seed+1, seed+1))
	go func() {
		defer close(producerDone)
		client := streams.NewClient(pool, nil)
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				return
			case <-time.After(time.Duration(prng.IntN(10)) * time.Millisecond):
			}
			n := 1 + prng.IntN(20)
			recs := make([]streams.Record, n)
			for j := range recs {
				recs[j] = streams.Record{Stream: stream, Key: fmt.Sprint(i, "-", j), Data: []byte(`{}`)}
			}
			pos, err := client.Produce(ctx, recs...)
			if err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			mu.Lock()
			produced = append(produced, pos...)
			mu.Unlock()
		}
	}()

	// The watcher samples committed offsets and checks they never decrease.
	type commitSample struct {
		partition int32
		offset    int64
		member    string
	}
	var samples []commitSample
	stopWatching := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		last := map[int32]int64{}
		for {
			select {
			case <-stopWatching:
				return
			case <-time.After(10 * time.Millisecond):
			}
			rows, err := pool.Query(ctx, `SELECT partition, "offset", coalesce(committed_by, '') FROM streamd.consumer_offsets
				WHERE stream_name = $1 AND group_id = $2`, stream, group)
			if err != nil {
				t.Errorf("watch offsets: %v", err)
				return
			}
			for rows.Next() {
				var s commitSample
				if err := rows.Scan(&s.partition, &s.offset, &s.member); err != nil {
					t.Errorf("scan: %v", err)
				}
				if prev, ok := last[s.partition]; ok && s.offset < prev {
					t.Errorf("committed offset of partition %d decreased from %d to %d", s.partition, prev, s.offset)
				}
				last[s.partition] = s.offset
				samples = append(samples, s)
			}
			rows.Close()
		}
	}()

	type live struct {
		c    *Consumer
		stop func() error
	}
	var members []live
	var all []*Consumer
	start := func() {
		cfg := testConfig(stream, group)
		cfg.SessionTimeout = time.Second
		cfg.MaxBatchSize = 1 + rng.IntN(30)
		cfg.hooks = &testHooks{} // killed below
		c, err := New(pool, cfg)
		require.NoError(t, err)
		members = append(members, live{c, runConsumer(t, c, handler)})
		all = append(all, c)
	}
	var joins, leaves, kills int
	for deadline := time.Now().Add(duration); time.Now().Before(deadline); {
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond) // pacing of the chaos, not a wait
		switch op := rng.IntN(10); {
		case len(members) < 2 || (op < 4 && len(members) < 5):
			start()
			joins++
		case op < 7:
			i := rng.IntN(len(members))
			require.NoError(t, members[i].stop())
			members = slices.Delete(members, i, i+1)
			leaves++
		default:
			i := rng.IntN(len(members))
			members[i].c.hooks.killed.Store(true)
			require.NoError(t, members[i].stop())
			members = slices.Delete(members, i, i+1)
			kills++
		}
	}
	t.Logf("%d joins, %d clean leaves, %d kills", joins, leaves, kills)
	close(stopProducing)
	<-producerDone
	waitFor(t, 30*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	close(stopWatching)
	<-watcherDone
	for _, m := range members {
		require.NoError(t, m.stop())
	}

	mu.Lock()
	defer mu.Unlock()
	// Every record handled at least once.
	done := map[int32][][2]int64{}
	for _, r := range log {
		if r.ok {
			done[r.partition] = append(done[r.partition], [2]int64{r.first, r.last})
		}
	}
	for _, p := range produced {
		covered := slices.ContainsFunc(done[p.Partition], func(iv [2]int64) bool { return iv[0] <= p.Offset && p.Offset <= iv[1] })
		require.True(t, covered, "record %d/%d never handled", p.Partition, p.Offset)
	}
	// No partition handled by two members at once.
	byPartition := map[int32][]batchRecord{}
	for _, r := range log {
		byPartition[r.partition] = append(byPartition[r.partition], r)
	}
	for p, rs := range byPartition {
		slices.SortFunc(rs, func(a, b batchRecord) int { return a.start.Compare(b.start) })
		for i := 1; i < len(rs); i++ {
			prev, cur := rs[i-1], rs[i]
			require.False(t, cur.start.Before(prev.end),
				"partition %d: %s (epoch %d) started %v before %s (epoch %d) finished", p, cur.member, cur.epoch,
				prev.end.Sub(cur.start), prev.member, prev.epoch)
		}
	}
	// Every sampled commit was made by the member that handled the batch ending there.
	handledBy := map[[2]int64]map[string]bool{}
	for _, r := range log {
		if r.ok {
			k := [2]int64{int64(r.partition), r.last + 1}
			if handledBy[k] == nil {
				handledBy[k] = map[string]bool{}
			}
			handledBy[k][r.member] = true
		}
	}
	for _, s := range samples {
		require.True(t, handledBy[[2]int64{int64(s.partition), s.offset}][s.member],
			"offset %d of partition %d committed by %s, which did not handle the batch ending there", s.offset, s.partition, s.member)
	}
	fenced := 0.0
	for _, c := range all {
		fenced += counterValue(c.metrics.fencedCommits)
	}
	t.Logf("%d records, %d batches, %d commit samples, %v fenced commits refused", len(produced), len(log), len(samples), fenced)
}
