package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/consumergroup"
)

// newGroupsCmd is `streamd groups`, modelled on kafka-consumer-groups.sh.
func newGroupsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "groups", Short: "List, describe, reset and delete consumer groups; pause partitions; dead letters"}
	var stream string
	cmd.PersistentFlags().StringVar(&stream, "stream", "", "the stream (required except for list)")

	withAdmin := func(run func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			return run(cmd.Context(), consumergroup.NewAdmin(pool), cmd, args)
		}
	}
	needStream := func() error {
		if stream == "" {
			return fmt.Errorf("--stream is required")
		}
		return nil
	}

	list := &cobra.Command{
		Use: "list", Short: "List groups (of --stream, else all)", Args: cobra.NoArgs,
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, _ []string) error {
			gs, err := a.ListGroups(ctx, stream)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), gs, func(tw *tabwriter.Writer) {
				row(tw, "STREAM", "GROUP", "MEMBERS", "PARTITIONS", "PENDING", "LAG")
				for _, x := range gs {
					row(tw, x.Stream, x.Group, x.Members, x.Partitions, x.PendingMoves, x.Lag)
				}
			})
		}),
	}
	describe := &cobra.Command{
		Use: "describe GROUP", Short: "Per partition: committed offset, log end, lag, owner; and the members", Args: cobra.ExactArgs(1),
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
			if err := needStream(); err != nil {
				return err
			}
			d, err := a.DescribeGroup(ctx, stream, args[0])
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), d, func(tw *tabwriter.Writer) {
				row(tw, "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "OWNER", "PENDING-OWNER", "PAUSED")
				for _, p := range d.PartitionStatus {
					cur := "-"
					if p.CommittedOffset != nil {
						cur = strconv.FormatInt(*p.CommittedOffset, 10)
					}
					row(tw, p.Partition, cur, p.LogEndOffset, p.Lag, dash(p.Owner), dash(p.PendingOwner), p.Paused)
				}
				row(tw)
				row(tw, "MEMBER", "INSTANCE", "EPOCH", "LAST-HEARTBEAT", "STALE")
				for _, m := range d.MemberStatus {
					row(tw, m.ConsumerID, dash(m.InstanceID), m.MemberEpoch, m.LastHeartbeat.Format(time.RFC3339Nano), m.Stale)
				}
			})
		}),
	}

	var opts consumergroup.ResetOpts
	var toEarliest, toLatest, execute, dryRun bool
	var toOffset, shiftBy int64
	var toTime string
	var partitions []int32
	reset := &cobra.Command{
		Use:   "reset-offsets GROUP",
		Short: "Reset committed offsets: --to-earliest | --to-latest | --to-datetime T | --to-offset N | --shift-by N; preview unless --execute",
		Long: `Reset a group's committed offsets. As with kafka-consumer-groups, the command
previews by default (--dry-run): it prints the offsets the reset would set and
changes nothing; --execute makes the reset. Refused while the group has live
members unless --force, which expels them (their commits are fenced; they rejoin and
start from the new offsets). New offsets are clamped to the stored log.`,
		Args: cobra.ExactArgs(1),
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
			if err := needStream(); err != nil {
				return err
			}
			n := 0
			f := cmd.Flags()
			if toEarliest {
				opts.Mode, n = consumergroup.ResetToEarliest, n+1
			}
			if toLatest {
				opts.Mode, n = consumergroup.ResetToLatest, n+1
			}
			if f.Changed("to-offset") {
				opts.Mode, opts.Value, n = consumergroup.ResetToOffset, toOffset, n+1
			}
			if f.Changed("shift-by") {
				opts.Mode, opts.Value, n = consumergroup.ResetShiftBy, shiftBy, n+1
			}
			if toTime != "" {
				t, err := time.Parse(time.RFC3339Nano, toTime)
				if err != nil {
					return fmt.Errorf("--to-datetime %q: want RFC 3339, e.g. 2025-01-02T15:04:05Z", toTime)
				}
				opts.Mode, opts.Time, n = consumergroup.ResetToTimestamp, t, n+1
			}
			if n != 1 {
				return fmt.Errorf("give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by")
			}
			if f.Changed("partitions") {
				opts.Partitions = partitions
			}
			if execute && f.Changed("dry-run") && dryRun {
				return fmt.Errorf("--dry-run and --execute contradict each other: choose one")
			}
			opts.DryRun = !execute
			changes, err := a.ResetOffsets(ctx, stream, args[0], opts)
			if err != nil {
				return err
			}
			if changes == nil {
				changes = []consumergroup.OffsetChange{}
			}
			if !execute {
				fmt.Fprintln(cmd.ErrOrStderr(), "preview only: nothing changed; add --execute to reset the offsets")
			}
			return g.print(cmd.OutOrStdout(), changes, func(tw *tabwriter.Writer) {
				row(tw, "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET")
				for _, c := range changes {
					prev := "-"
					if c.Previous != nil {
						prev = strconv.FormatInt(*c.Previous, 10)
					}
					row(tw, c.Partition, prev, c.New)
				}
			})
		}),
	}
	rf := reset.Flags()
	rf.BoolVar(&toEarliest, "to-earliest", false, "reset to the log start")
	rf.BoolVar(&toLatest, "to-latest", false, "reset to the log end")
	rf.StringVar(&toTime, "to-datetime", "", "reset to the first event at or after this RFC 3339 time")
	rf.Int64Var(&toOffset, "to-offset", 0, "reset to this offset")
	rf.Int64Var(&shiftBy, "shift-by", 0, "move the committed offsets by N (may be negative)")
	rf.Int32SliceVar(&partitions, "partitions", nil, "only these partitions (default all)")
	rf.BoolVar(&opts.Force, "force", false, "reset even with live members (expels them)")
	rf.BoolVar(&execute, "execute", false, "make the reset (without it, the command previews)")
	rf.BoolVar(&dryRun, "dry-run", true, "preview the reset and change nothing (the default)")

	var force bool
	del := &cobra.Command{
		Use: "delete GROUP", Short: "Delete a group, its members and committed offsets", Args: cobra.ExactArgs(1),
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
			if err := needStream(); err != nil {
				return err
			}
			if err := a.DeleteGroup(ctx, stream, args[0], force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted group %s of %s\n", args[0], stream)
			return nil
		}),
	}
	del.Flags().BoolVar(&force, "force", false, "delete even with live members")

	pauseCmd := func(pause bool) *cobra.Command {
		use, short := "resume GROUP PARTITION...", "Resume paused partitions"
		if pause {
			use, short = "pause GROUP PARTITION...", "Pause partitions for the whole group"
		}
		return &cobra.Command{
			Use: use, Short: short, Args: cobra.MinimumNArgs(2),
			RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
				if err := needStream(); err != nil {
					return err
				}
				ps, err := parsePartitions(args[1:])
				if err != nil {
					return err
				}
				if pause {
					return a.Pause(ctx, stream, args[0], ps...)
				}
				return a.Resume(ctx, stream, args[0], ps...)
			}),
		}
	}

	var dlGroup, dlStatus, resolvedBy string
	dead := &cobra.Command{
		Use:   "dead-letters [list | replay ID | discard ID | resolve ID]",
		Short: "List a stream's dead letters; replay one to its group only, discard it, or mark it resolved (dealt with by hand)",
		Args:  cobra.RangeArgs(0, 2),
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
			if err := needStream(); err != nil {
				return err
			}
			if len(args) == 0 || args[0] == "list" {
				dl, err := a.DeadLetters(ctx, stream, dlGroup, dlStatus)
				if err != nil {
					return err
				}
				return g.print(cmd.OutOrStdout(), dl, func(tw *tabwriter.Writer) {
					row(tw, "ID", "GROUP", "PARTITION", "OFFSET", "ATTEMPTS", "STATUS", "RESOLVED BY", "ERROR")
					for _, d := range dl {
						row(tw, d.ID, d.Group, d.Partition, d.Offset, d.Attempts, d.Status, orDash(d.ResolvedBy), d.Error)
					}
				})
			}
			if len(args) != 2 {
				return fmt.Errorf("%s needs an ID", args[0])
			}
			id, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return fmt.Errorf("dead letter id %q: want a number", args[1])
			}
			switch args[0] {
			case "replay":
				if err := a.ReplayDeadLetter(ctx, stream, id, resolvedBy); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "dead letter %d replayed: its group's member for the partition redelivers it\n", id)
				return nil
			case "discard":
				return a.DiscardDeadLetter(ctx, stream, id, resolvedBy)
			case "resolve":
				return a.ResolveDeadLetter(ctx, stream, id, resolvedBy)
			}
			return fmt.Errorf("unknown action %q: want list, replay, discard or resolve", args[0])
		}),
	}
	dead.Flags().StringVar(&dlGroup, "group", "", "only this group's dead letters")
	dead.Flags().StringVar(&dlStatus, "status", "pending", "pending, replayed, discarded, resolved, or '' for all")
	dead.Flags().StringVar(&resolvedBy, "by", envOr("USER", "cli"), "who resolves (recorded)")

	cmd.AddCommand(list, describe, reset, del, pauseCmd(true), pauseCmd(false), dead)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func parsePartitions(args []string) ([]int32, error) {
	out := make([]int32, len(args))
	for i, a := range args {
		p, err := strconv.ParseInt(a, 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("partition %q: want a non-negative number", a)
		}
		out[i] = int32(p)
	}
	return out, nil
}

// newConsumeCmd is `streamd consume --stream S --group G` (like kcat -G): joins the
// group and prints each event as a JSON line, committing after each batch, until
// interrupted (then leaves the group).
func newConsumeCmd(g *globals) *cobra.Command {
	var cfg consumergroup.Config
	var fromLatest bool
	var count int
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Consume a stream as a member of a consumer group, printing events as JSON lines",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requirePositive(cmd, "batch-size", "session-timeout"); err != nil {
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
			c, err := consumergroup.New(pool, &cfg)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			// -c N (kcat's): stop once N events were printed; the batch that reached
			// N is committed as the member leaves.
			runCtx, done := context.WithCancel(ctx)
			defer done()
			printed := 0
			return c.Run(runCtx, func(ctx context.Context, b *consumergroup.Batch) error {
				for _, e := range b.Events {
					if count > 0 && printed >= count {
						break
					}
					if err := enc.Encode(e); err != nil {
						return err
					}
					printed++
				}
				if count > 0 && printed >= count {
					done()
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Stream, "stream", "", "the stream (required)")
	f.StringVar(&cfg.Group, "group", "", "the consumer group (required)")
	f.StringVar(&cfg.InstanceID, "instance-id", "", "static membership instance id")
	f.BoolVar(&fromLatest, "from-latest", false, "without a committed offset, start at the log end (default: log start)")
	f.IntVarP(&count, "count", "c", 0, "exit after printing this many events (0: run until interrupted)")
	f.IntVar(&cfg.MaxBatchSize, "batch-size", 500, "events per batch")
	f.DurationVar(&cfg.SessionTimeout, "session-timeout", 30*time.Second, "session timeout")
	return cmd
}

// orDash is s, or "-" when s is empty (a table cell).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
