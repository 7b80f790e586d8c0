package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/streams"
)

// newFetchCmd is `streamd fetch STREAM` (kcat -C): read partitions without a group.
func newFetchCmd(g *globals) *cobra.Command {
	var (
		rf        readFlags
		partition int32
		fromTime  string
		follow    bool
	)
	cmd := &cobra.Command{
		Use:   "fetch STREAM",
		Short: "Print a stream's records (kcat -C): every partition or one (-p), from -o, to the end or --follow",
		Long: `Prints the records of every partition of STREAM, or of one (-p), without a consumer
group, as kcat -C does: from the log start, or from -o (beginning, end, an offset N, -N
for N records before the end, @T for the first record at or after T, in milliseconds
since the epoch or RFC 3339), to each partition's end (the end when fetch started), one
partition after the other. --follow keeps reading every partition as records arrive
(until Ctrl-C or -c) and says on stderr when a partition reached its end
("% Reached end of stream S [P] at offset X"); -e exits at the ends, which is what
fetch does without --follow (it then prints the same notices).

Records print as JSON lines (--output json, the default here), a table (--output table)
or kcat's format string (-f '%p@%o %k=%s\n').`,
		Example: `  streamd fetch orders -c 10
  streamd fetch orders -o beginning -e -f '%p@%o %k=%s\n'
  streamd fetch orders -p 0 -o -5               # the last 5 records of partition 0
  streamd fetch orders -o @2026-11-22T10:00:00Z --follow`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := rf.parse()
			if err != nil {
				return err
			}
			if rf.offset == "stored" {
				return errors.New("--offset stored is a group's committed offset: fetch reads without a group (consume GROUP reads from it)")
			}
			if fromTime != "" {
				if rf.offset != "" {
					return errors.New("--from-time and --offset both say where to start: give one (--offset @T is --from-time T)")
				}
				if spec, err = parseOffsetTime("@"+fromTime, fromTime); err != nil {
					return fmt.Errorf("--from-time %q: want RFC 3339, e.g. 2026-11-22T10:00:00Z", fromTime)
				}
			}
			if follow && rf.exitEOF {
				return errors.New("--follow and --exit contradict each other: choose one")
			}
			pr, err := newRecordPrinter(cmd.OutOrStdout(), g.output, rf.format)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			pool, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			c := streams.NewClient(pool, nil)
			info, err := c.DescribeStream(ctx, args[0])
			if err != nil {
				return err
			}
			parts := info.PartitionInfo
			if cmd.Flags().Changed("partition") {
				i := slices.IndexFunc(parts, func(p streams.PartitionInfo) bool { return p.Partition == partition })
				if i < 0 {
					return fmt.Errorf("--partition %d: stream %s has partitions 0 to %d", partition, args[0], len(parts)-1)
				}
				parts = parts[i : i+1]
			}
			starts := make([]int64, len(parts))
			for i, p := range parts {
				if starts[i], err = spec.resolve(ctx, c, args[0], p); err != nil {
					return err
				}
			}
			f := &fetcher{c: c, stream: args[0], parts: parts, starts: starts, count: rf.count, pr: pr,
				notices: cmd.ErrOrStderr(), notify: follow || rf.exitEOF}
			if follow {
				return f.follow(ctx)
			}
			return f.toEnd(ctx)
		},
	}
	rf.register(cmd, "where to start in each partition: "+offsetHelp+" (default: the log start)")
	f := cmd.Flags()
	f.Int32VarP(&partition, "partition", "p", 0, "read only this partition (default: every partition)")
	f.BoolVar(&follow, "follow", false, "keep reading every partition as records arrive (until Ctrl-C or --count)")
	f.StringVar(&fromTime, "from-time", "", "start at the first record at or after this RFC 3339 time (= --offset @T)")
	f.IntVarP(&rf.count, "max", "n", 0, "the former name of --count")
	_ = f.MarkHidden("max")
	return cmd
}

// fetcher reads partitions for fetch, from starts[i] for parts[i].
type fetcher struct {
	c       *streams.Client
	stream  string
	parts   []streams.PartitionInfo
	starts  []int64
	count   int // 0: no limit
	pr      *recordPrinter
	notices io.Writer // stderr
	notify  bool      // print end-of-partition notices
	printed int
}

// emit prints evs up to the count and reports whether the count is reached.
func (f *fetcher) emit(evs []streams.Event) (bool, error) {
	if f.count > 0 {
		evs = evs[:min(len(evs), f.count-f.printed)]
	}
	if err := f.pr.print(evs); err != nil {
		return false, err
	}
	f.printed += len(evs)
	return f.count > 0 && f.printed >= f.count, nil
}

// toEnd reads each partition in turn from its start to the end it had when fetch began.
func (f *fetcher) toEnd(ctx context.Context) error {
	for i, p := range f.parts {
		pos := f.starts[i]
		for pos < p.NextOffset {
			res, err := f.c.Fetch(ctx, f.stream, p.Partition, pos, &streams.FetchOpts{MaxRecords: 500})
			var oor *streams.OffsetOutOfRangeError
			if errors.As(err, &oor) && oor.Offset < oor.LogStartOffset {
				pos = oor.LogStartOffset // retention deleted what was next: go on from the log start
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil // Ctrl-C
				}
				return err
			}
			if len(res.Events) == 0 {
				break
			}
			done, err := f.emit(res.Events)
			if err != nil || done {
				return err
			}
			pos = res.NextOffset
		}
		if f.notify {
			endNotice(f.notices, f.stream, p.Partition, pos, i == len(f.parts)-1)
		}
	}
	return nil
}

// fetched is one long poll's result for a partition (or its error).
type fetched struct {
	partition int32
	res       *streams.FetchResult
	err       error
}

// follow reads every partition at once, one long-polling goroutine each, printing
// batches as they come, until ctx ends (Ctrl-C) or the count is reached. Each
// partition's records print in offset order; partitions interleave.
func (f *fetcher) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan fetched)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, runs first)
	defer cancel()
	for i, p := range f.parts {
		wg.Add(1)
		go func(partition int32, pos int64) { // owner: follow; exits when ctx ends
			defer wg.Done()
			opts := &streams.FetchOpts{MaxRecords: 500, MaxWait: time.Second}
			for {
				res, err := f.c.Fetch(ctx, f.stream, partition, pos, opts)
				var oor *streams.OffsetOutOfRangeError
				if errors.As(err, &oor) {
					pos = max(oor.LogStartOffset, min(oor.NextOffset, pos))
					continue
				}
				if ctx.Err() != nil {
					return
				}
				select {
				case ch <- fetched{partition: partition, res: res, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
				pos = res.NextOffset
			}
		}(p.Partition, f.starts[i])
	}
	// A partition is at its end when a fetch read up to the high watermark; its notice
	// prints once each time it gets there (kcat's "Reached end of topic").
	atEnd := map[int32]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-ch:
			if r.err != nil {
				return r.err
			}
			if len(r.res.Events) > 0 {
				atEnd[r.partition] = false
				done, err := f.emit(r.res.Events)
				if err != nil || done {
					return err
				}
			}
			if r.res.NextOffset >= r.res.HighWatermark && !atEnd[r.partition] {
				atEnd[r.partition] = true
				endNotice(f.notices, f.stream, r.partition, r.res.NextOffset, false)
			}
		}
	}
}
