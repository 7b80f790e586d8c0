package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
	var allGroups bool
	describe := &cobra.Command{
		Use: "describe GROUP | --all-groups", Short: "Per partition: committed offset, log end, lag, owner; and the members",
		Long: `Describes GROUP of --stream: per partition its committed offset, log end, lag, owner
and whether it is paused, then its members. With --all-groups, every group (of --stream,
else of every stream): one row per group and partition.`,
		Args: cobra.RangeArgs(0, 1),
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
			if allGroups {
				if len(args) > 0 {
					return fmt.Errorf("--all-groups describes every group: give no GROUP")
				}
				return describeAllGroups(ctx, g, a, cmd, stream)
			}
			if len(args) == 0 {
				return fmt.Errorf("give a GROUP, or --all-groups")
			}
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
					row(tw, p.Partition, committed(p.CommittedOffset), p.LogEndOffset, p.Lag, dash(p.Owner), dash(p.PendingOwner), p.Paused)
				}
				row(tw)
				row(tw, "MEMBER", "INSTANCE", "EPOCH", "LAST-HEARTBEAT", "STALE")
				for _, m := range d.MemberStatus {
					row(tw, m.ConsumerID, dash(m.InstanceID), m.MemberEpoch, m.LastHeartbeat.Format(time.RFC3339Nano), m.Stale)
				}
			})
		}),
	}
	describe.Flags().BoolVar(&allGroups, "all-groups", false, "describe every group (of --stream, else of every stream)")

	var opts consumergroup.ResetOpts
	var toEarliest, toLatest, execute, dryRun bool
	var toOffset, shiftBy int64
	var toTime, fromFile string
	var partitions []int32
	reset := &cobra.Command{
		Use:   "reset-offsets GROUP",
		Short: "Reset committed offsets: --to-earliest | --to-latest | --to-datetime T | --to-offset N | --shift-by N | --from-file F; preview unless --execute",
		Long: `Reset a group's committed offsets. As with kafka-consumer-groups, the command
previews by default (--dry-run): it prints the offsets the reset would set and
changes nothing; --execute makes the reset. Refused while the group has live
members unless --force, which expels them (their commits are fenced; they rejoin and
start from the new offsets). New offsets are clamped to the stored log.

--from-file F (- for stdin) sets the offsets listed in F, lines of
stream,partition,offset as "groups offsets export" prints them (kafka-consumer-groups'
--export CSV), on every stream F names (--stream, when given, must be the only one),
all or nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: withAdmin(func(ctx context.Context, a *consumergroup.Admin, cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if execute && f.Changed("dry-run") && dryRun {
				return fmt.Errorf("--dry-run and --execute contradict each other: choose one")
			}
			if fromFile != "" {
				for _, name := range []string{"to-earliest", "to-latest", "to-datetime", "to-offset", "shift-by", "partitions"} {
					if f.Changed(name) {
						return fmt.Errorf("--from-file and --%s both say where to reset: choose one", name)
					}
				}
				return resetFromFile(ctx, g, a, cmd, stream, args[0], fromFile, execute, opts.Force)
			}
			if err := needStream(); err != nil {
				return err
			}
			n := 0
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
				return fmt.Errorf("give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by, --from-file")
			}
			if f.Changed("partitions") {
				opts.Partitions = partitions
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
					row(tw, c.Partition, committed(c.Previous), c.New)
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
	rf.StringVar(&fromFile, "from-file", "", "set the offsets this CSV file lists (stream,partition,offset lines, as groups offsets export prints; - for stdin)")

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
				if g.output == "json" {
					return printJSON(cmd.OutOrStdout(), map[string]any{"id": id, "status": "replayed"})
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

	cmd.AddCommand(list, describe, reset, del, pauseCmd(true), pauseCmd(false), dead, newGroupOffsetsCmd(g, &stream))
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

// committed is a committed offset for a table: "-" when there is none.
func committed(off *int64) string {
	if off == nil {
		return "-"
	}
	return strconv.FormatInt(*off, 10)
}

// describeAllGroups is groups describe --all-groups: every group of stream (every
// stream when ""), one row per group and partition. A group deleted between the
// listing and its description is left out.
func describeAllGroups(ctx context.Context, g *globals, a *consumergroup.Admin, cmd *cobra.Command, stream string) error {
	list, err := a.ListGroups(ctx, stream)
	if err != nil {
		return err
	}
	all := []*consumergroup.GroupDescription{}
	for _, s := range list {
		d, err := a.DescribeGroup(ctx, s.Stream, s.Group)
		if errors.Is(err, consumergroup.ErrGroupNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		all = append(all, d)
	}
	return g.print(cmd.OutOrStdout(), all, func(tw *tabwriter.Writer) {
		row(tw, "STREAM", "GROUP", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "OWNER", "PENDING-OWNER", "PAUSED", "MEMBERS")
		for _, d := range all {
			for _, p := range d.PartitionStatus {
				row(tw, d.Stream, d.Group, p.Partition, committed(p.CommittedOffset), p.LogEndOffset, p.Lag, dash(p.Owner), dash(p.PendingOwner), p.Paused, d.Members)
			}
		}
	})
}

// orDash is s, or "-" when s is empty (a table cell).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
