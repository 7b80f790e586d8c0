package main

import (
	"errors"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/streams"
)

// newStreamReadByCmd is `streamd stream read-by STREAM (--correlation-id ID |
// --event-type TYPE) [--limit N] [--after-partition P --after-offset O]`.
func newStreamReadByCmd(g *globals) *cobra.Command {
	var (
		corr, typ      string
		limit          int
		afterP         int32
		afterO         int64
		afterGiven     bool
		afterPartition = "after-partition"
	)
	cmd := &cobra.Command{
		Use:   "read-by STREAM",
		Short: "Read a stream's events with a correlation id or an event type",
		Long: `Prints a stream's retained events whose correlation id (--correlation-id) or event type
(--event-type) is the one given, in (partition, offset) order, up to --limit. Page on with
--after-partition and --after-offset set to the last event printed. With the stream's read
index (streamd stream index enable) it reads an index range; without, every event of the
stream.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (corr == "") == (typ == "") {
				return errors.New("give --correlation-id or --event-type, one of them")
			}
			afterGiven = cmd.Flags().Changed(afterPartition) || cmd.Flags().Changed("after-offset")
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			c := streams.NewClient(pool, nil)
			opts := &streams.ReadByOpts{Limit: limit}
			if afterGiven {
				opts.After = &streams.Position{Partition: afterP, Offset: afterO}
			}
			var evs []streams.Event
			if corr != "" {
				evs, err = c.ReadByCorrelationID(cmd.Context(), args[0], corr, opts)
			} else {
				evs, err = c.ReadByEventType(cmd.Context(), args[0], typ, opts)
			}
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), evs, func(tw *tabwriter.Writer) {
				row(tw, "PARTITION", "OFFSET", "TIMESTAMP", "EVENT TYPE", "CORRELATION ID", "KEY", "DATA")
				for _, e := range evs {
					row(tw, e.Partition, e.Offset, e.Timestamp.Format(time.RFC3339Nano), e.EventType, e.CorrelationID, e.Key, string(e.Data))
				}
			})
		},
	}
	cmd.Flags().StringVar(&corr, "correlation-id", "", "the correlation id to read")
	cmd.Flags().StringVar(&typ, "event-type", "", "the event type to read")
	cmd.Flags().IntVar(&limit, "limit", 500, "most events printed (1 to 10000)")
	cmd.Flags().Int32Var(&afterP, afterPartition, -1, "continue after this partition's --after-offset")
	cmd.Flags().Int64Var(&afterO, "after-offset", -1, "continue after this offset of --after-partition")
	return cmd
}

// newStreamIndexCmd is `streamd stream index enable|disable STREAM KIND` and
// `streamd stream index list STREAM`.
func newStreamIndexCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "index",
		Short: "Per-stream read indexes (correlation_id, event_type) for stream read-by",
	}
	toggle := func(use, short string, enable bool) *cobra.Command {
		return &cobra.Command{
			Use:   use + " STREAM correlation_id|event_type",
			Short: short,
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				pool, err := g.pool(cmd.Context())
				if err != nil {
					return err
				}
				defer pool.Close()
				c := streams.NewClient(pool, nil)
				if enable {
					return c.EnableReadIndex(cmd.Context(), args[0], streams.ReadIndex(args[1]))
				}
				return c.DisableReadIndex(cmd.Context(), args[0], streams.ReadIndex(args[1]))
			},
		}
	}
	list := &cobra.Command{
		Use:   "list STREAM",
		Short: "List a stream's read indexes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			idx, err := streams.NewClient(pool, nil).ReadIndexes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), idx, func(tw *tabwriter.Writer) {
				row(tw, "KIND", "INDEX", "VALID")
				for _, i := range idx {
					row(tw, i.Kind, i.Index, i.Valid)
				}
			})
		},
	}
	cmd.AddCommand(
		toggle("enable", "Build a stream's read index (CONCURRENTLY: appends go on; an invalid one a failed build left is rebuilt); its appends then pay one more index entry", true),
		toggle("disable", "Drop a stream's read index", false),
		list)
	return cmd
}
