package main

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

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
	var wait bool
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
			if wait {
				return watchTask(cmd, g, c, t.DLQ, t.ID)
			}
			return printTasks(g, cmd, []messages.RedriveTask{*t})
		},
	}
	create.Flags().Float64Var(&opts.Rate, "rate", 100, "most messages per second (0: unbounded)")
	create.Flags().Int64Var(&opts.MaxMessages, "max", 0, "most messages to move (0: the dead letters there now)")
	create.Flags().BoolVar(&wait, "wait", false, "wait for the task to finish, showing its progress (as dlq task watch)")
	watch := &cobra.Command{
		Use:   "watch DLQ ID",
		Short: "Show a redrive task's progress until it finishes (Ctrl-C stops watching, not the task)",
		Long: `Shows how many messages redrive task ID of DLQ has moved, until it is done, failed or
canceled: on a terminal one line rewritten in place, otherwise a log line every 5
seconds and at the end. Then prints the task; a failed or canceled task is an error.
streamd serve's leader runs the task; watching only reads it.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return fmt.Errorf("task id %q: want a number", args[1])
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			return watchTask(cmd, g, c, args[0], id)
		},
	}
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
	cmd.AddCommand(create, list, cancel, watch)
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

// watchTask reports task id of dlq's progress (moved of max) until it finishes, then
// prints it. On a terminal the progress is one line rewritten in place; otherwise a
// log line every few seconds and a last one. Ctrl-C stops the watch, not the task.
func watchTask(cmd *cobra.Command, g *globals, c *messages.Client, dlq string, id int64) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	prog := newProgress(cmd.ErrOrStderr(), g.logger, fmt.Sprintf("redrive task %d of %s", id, dlq))
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		// The newest 1000 tasks: a task being watched is among them.
		ts, err := c.ListRedriveTasks(ctx, "")
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		i := slices.IndexFunc(ts, func(t messages.RedriveTask) bool { return t.DLQ == dlq && t.ID == id })
		if i < 0 {
			return fmt.Errorf("watch redrive task %d of queue %s: %w", id, dlq, messages.ErrRedriveTaskNotFound)
		}
		t := ts[i]
		final := t.Status != messages.RedriveTaskPending && t.Status != messages.RedriveTaskRunning
		prog.update(int(t.Moved), int(t.MaxMessages), final, "status", t.Status)
		if final {
			if err := printTasks(g, cmd, []messages.RedriveTask{t}); err != nil {
				return err
			}
			switch t.Status {
			case messages.RedriveTaskFailed:
				msg := ""
				if t.Error != nil {
					msg = *t.Error
				}
				return fmt.Errorf("redrive task %d of %s failed after moving %d: %s", id, dlq, t.Moved, msg)
			case messages.RedriveTaskCanceled:
				return fmt.Errorf("redrive task %d of %s was canceled after moving %d", id, dlq, t.Moved)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
