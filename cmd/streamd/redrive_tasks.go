package main

import (
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/messages"
)

// newRedriveTaskCmd is `streamd dlq task create|list|cancel`: background redrive
// tasks that streamd serve's leader runs (the API's /v1/queues/{dlq}/redrive-tasks).
func newRedriveTaskCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Background redrive tasks, run by streamd serve's leader at a bounded rate",
	}
	var opts messages.RedriveTaskOpts
	create := &cobra.Command{
		Use:   "create DLQ",
		Short: "Queue a background redrive of DLQ's dead letters (those there now, or --max)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			o := opts
			o.CreatedBy = envOr("USER", "cli")
			t, err := c.CreateRedriveTask(cmd.Context(), args[0], &o)
			if err != nil {
				return err
			}
			return printTasks(g, cmd, []messages.RedriveTask{*t})
		},
	}
	create.Flags().Float64Var(&opts.Rate, "rate", 100, "most messages per second (0: unbounded)")
	create.Flags().Int64Var(&opts.MaxMessages, "max", 0, "most messages to move (0: the dead letters there now)")
	var status string
	list := &cobra.Command{
		Use:   "list",
		Short: "List redrive tasks, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			ts, err := c.ListRedriveTasks(cmd.Context(), status)
			if err != nil {
				return err
			}
			return printTasks(g, cmd, ts)
		},
	}
	list.Flags().StringVar(&status, "status", "", "only tasks in this status: pending, running, done, failed or canceled")
	cancel := &cobra.Command{
		Use:   "cancel DLQ ID",
		Short: "Cancel an open redrive task (what it moved stays moved)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return err
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			t, err := c.CancelRedriveTask(cmd.Context(), args[0], id)
			if err != nil {
				return err
			}
			return printTasks(g, cmd, []messages.RedriveTask{*t})
		},
	}
	cmd.AddCommand(create, list, cancel)
	return cmd
}

func printTasks(g *globals, cmd *cobra.Command, ts []messages.RedriveTask) error {
	if ts == nil {
		ts = []messages.RedriveTask{}
	}
	return g.print(cmd.OutOrStdout(), ts, func(tw *tabwriter.Writer) {
		row(tw, "DLQ", "ID", "STATUS", "MOVED", "MAX", "RATE", "CREATED")
		for _, t := range ts {
			row(tw, t.DLQ, t.ID, t.Status, t.Moved, t.MaxMessages, t.Rate, t.CreatedAt.Format("2006-01-02T15:04:05Z07:00"))
		}
	})
}
