package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/streams"
)

// newConsumeCmd is `streamd consume STREAM --group G` (kcat -G): joins the group and
// prints each event, committing what it printed, until interrupted, -c or -e (then
// leaves the group).
func newConsumeCmd(g *globals) *cobra.Command {
	var (
		cfg        consumergroup.Config
		rf         readFlags
		stream     string
		fromLatest bool
	)
	cmd := &cobra.Command{
		Use:   "consume STREAM --group GROUP",
		Short: "Consume a stream as a member of a consumer group (kcat -G), printing its records",
		Long: `Joins GROUP on STREAM and prints the records of the partitions the group gives this
member, committing each batch's offset once its records are printed, until Ctrl-C, -c N
records (exactly: the rest of the last batch is not committed, and the group reads it
next) or, with -e, until every partition it owns is at its end. The member then leaves
the group. A partition starts at the group's committed offset (--from-latest: the log
end when there is none, else the log start), unless -o names another start, which then
applies, as with kcat -G -o, the first time this member gets each partition: -o moves
the group's committed offset there. On stderr, "% Reached end of stream S [P] at
offset X" each time a partition it owns is consumed to its end.

Records print as JSON lines (--output json, the default here), a table (--output table)
or kcat's format string (-f '%p@%o %k=%s\n').`,
		Example: `  streamd consume orders -G billing -c 10
  streamd consume orders -G audit -o beginning -e -f '%p@%o %s\n'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requirePositive(cmd, "batch-size", "session-timeout"); err != nil {
				return err
			}
			var err error
			if cfg.Stream, err = streamArg(cmd, args, stream); err != nil {
				return err
			}
			if cfg.Group == "" {
				return errors.New("--group is required: the consumer group to join")
			}
			spec, err := rf.parse()
			if err != nil {
				return err
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
			cfg.Logger = g.logger
			if fromLatest {
				cfg.AutoOffsetReset = consumergroup.ResetLatest
			}
			// Manual commits: the handler commits the offset after the last record it
			// printed, so -c N commits exactly N and the group reads the rest next.
			cfg.CommitMode = consumergroup.CommitManual
			var c *consumergroup.Consumer
			if spec.kind != offsetStored {
				positioned := map[int32]bool{} // hooks run on one goroutine
				cfg.OnAssigned = func(ctx context.Context, _ consumergroup.Membership, parts []int32) {
					if err := startAt(ctx, c, streams.NewClient(pool, nil), cfg.Stream, spec, parts, positioned); err != nil {
						g.logger.Warn("could not move the group's offsets to --offset; the partitions start at the committed offsets",
							"stream", cfg.Stream, "group", cfg.Group, "partitions", parts, "error", err)
					}
				}
			}
			if c, err = consumergroup.New(pool, &cfg); err != nil {
				return err
			}
			runCtx, done := context.WithCancel(ctx)
			defer done()
			var (
				mu       sync.Mutex
				printed  int
				printErr error
			)
			watchDone := make(chan struct{})
			go func() { // owner: consume; exits when runCtx ends
				defer close(watchDone)
				watchEnds(runCtx, c, consumergroup.NewAdmin(pool), cfg.Stream, cfg.Group, cmd.ErrOrStderr(), fromLatest, rf.exitEOF, done)
			}()
			err = c.Run(runCtx, func(ctx context.Context, b *consumergroup.Batch) error {
				mu.Lock()
				defer mu.Unlock()
				evs := b.Events
				if rf.count > 0 {
					evs = evs[:min(len(evs), max(0, rf.count-printed))]
				}
				if len(evs) == 0 || printErr != nil {
					return nil // past -c, or stdout is gone: not committed
				}
				if err := pr.print(evs); err != nil {
					printErr = err
					done()
					return nil
				}
				printed += len(evs)
				if rf.count > 0 && printed >= rf.count {
					done()
				}
				return c.Commit(ctx, consumergroup.PartitionOffset{Partition: b.Partition, Offset: evs[len(evs)-1].Offset + 1})
			})
			done()
			<-watchDone
			return errors.Join(err, printErr)
		},
	}
	rf.register(cmd, "where each partition starts the first time this member gets it, overriding the group's committed offset: "+offsetHelp+", or stored (the default: the committed offset)")
	f := cmd.Flags()
	f.StringVar(&stream, "stream", "", "the stream (the argument's former flag)")
	_ = f.MarkHidden("stream")
	f.StringVarP(&cfg.Group, "group", "G", "", "the consumer group (required)")
	f.StringVar(&cfg.InstanceID, "instance-id", "", "static membership instance id")
	f.BoolVar(&fromLatest, "from-latest", false, "without a committed offset, start at the log end (default: log start)")
	f.IntVar(&cfg.MaxBatchSize, "batch-size", 500, "events per batch")
	f.DurationVar(&cfg.SessionTimeout, "session-timeout", 30*time.Second, "session timeout")
	return cmd
}

// startAt commits, for each of parts this member has not positioned yet, the offset
// spec names (kcat -G -o: the start overrides the committed offset). Called from
// OnAssigned, before the partitions' workers read their committed offsets.
func startAt(ctx context.Context, c *consumergroup.Consumer, sc *streams.Client, stream string, spec offsetSpec, parts []int32, positioned map[int32]bool) error {
	var todo []int32
	for _, p := range parts {
		if !positioned[p] {
			todo = append(todo, p)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	info, err := sc.DescribeStream(ctx, stream)
	if err != nil {
		return err
	}
	var offs []consumergroup.PartitionOffset
	for _, pi := range info.PartitionInfo {
		for _, p := range todo {
			if pi.Partition != p {
				continue
			}
			off, err := spec.resolve(ctx, sc, stream, pi)
			if err != nil {
				return err
			}
			offs = append(offs, consumergroup.PartitionOffset{Partition: p, Offset: off, Metadata: "cli:--offset"})
		}
	}
	if err := c.Commit(ctx, offs...); err != nil {
		return err
	}
	for _, p := range todo {
		positioned[p] = true
	}
	return nil
}

// watchEnds prints kcat's end-of-partition notice each time a partition this member
// owns is consumed to its end (its committed offset reached the log end), and with
// exit calls done once every partition it owns is there. It polls the group's
// description, since a partition at its end gives the handler no batch to say so.
func watchEnds(ctx context.Context, c *consumergroup.Consumer, a *consumergroup.Admin, stream, group string, w io.Writer, fromLatest, exit bool, done func()) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	atEnd := map[int32]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owned := c.Assignment()
		if len(owned) == 0 {
			continue
		}
		d, err := a.DescribeGroup(ctx, stream, group)
		if err != nil {
			continue // not created yet, or a transient error: look again
		}
		all := true
		for _, p := range owned {
			for _, st := range d.PartitionStatus {
				if st.Partition != p {
					continue
				}
				// Without a commit, a partition is at its end when it is empty, or
				// with --from-latest (it started at the end, and has printed nothing).
				end := fromLatest || st.LogEndOffset == st.LogStartOffset
				if st.CommittedOffset != nil {
					end = *st.CommittedOffset >= st.LogEndOffset
				}
				if end && !atEnd[p] {
					endNotice(w, stream, p, st.LogEndOffset, false)
				}
				atEnd[p] = end
				all = all && end
			}
		}
		if exit && all {
			done()
			return
		}
	}
}
