package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/messages"
)

// queueClient opens a pool and a messages.Client on it; close the pool when done.
func queueClient(cmd *cobra.Command, g *globals) (*messages.Client, func(), error) {
	pool, err := g.pool(cmd.Context())
	if err != nil {
		return nil, nil, err
	}
	c, err := messages.NewClient(pool, &messages.ClientConfig{Logger: g.logger})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, pool.Close, nil
}

func newQueueCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Visibility-timeout queues: create, send, receive, ack, nack, extend, stats, purge, delete",
	}
	var qc messages.QueueConfig
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a queue, or change the given settings of an existing one",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requirePositive(cmd, "max-attempts", "max-payload", "visibility-timeout"); err != nil {
				return err
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			// On an existing queue only the flags given change: the others keep the
			// queue's settings (their defaults would have replaced them, a dead-letter
			// queue included).
			fl := cmd.Flags()
			u := &messages.QueueUpdate{}
			if fl.Changed("fifo") {
				u.FIFO = &qc.FIFO
			}
			if fl.Changed("visibility-timeout") {
				u.VisibilityTimeout = &qc.VisibilityTimeout
			}
			if fl.Changed("max-attempts") {
				u.MaxDeliveryAttempts = &qc.MaxDeliveryAttempts
			}
			if fl.Changed("dead-letter-queue") {
				u.DeadLetterQueue = &qc.DeadLetterQueue
			}
			if fl.Changed("max-payload") {
				u.MaxPayloadBytes = &qc.MaxPayloadBytes
			}
			q, err := c.SetQueue(cmd.Context(), args[0], u)
			if err != nil {
				return err
			}
			return printQueues(g, cmd, []messages.QueueInfo{*q})
		},
	}
	f := create.Flags()
	f.BoolVar(&qc.FIFO, "fifo", false, "deliver messages of one --group one at a time, in order")
	f.DurationVar(&qc.VisibilityTimeout, "visibility-timeout", 30*time.Second, "default lease of a receive")
	f.IntVar(&qc.MaxDeliveryAttempts, "max-attempts", 5, "deliveries before a message moves to the dead-letter queue")
	f.StringVar(&qc.DeadLetterQueue, "dead-letter-queue", "", "queue that receives messages after --max-attempts (must exist)")
	f.IntVar(&qc.MaxPayloadBytes, "max-payload", 262144, "largest message (data plus headers) in bytes")

	list := &cobra.Command{
		Use:   "list",
		Short: "List queues",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			all, err := c.ListQueues(cmd.Context())
			if err != nil {
				return err
			}
			return printQueues(g, cmd, all)
		},
	}

	var (
		sendID      string
		sendGroup   string
		sendDelay   time.Duration
		sendHeaders []string
	)
	send := &cobra.Command{
		Use:   "send QUEUE [JSON...]",
		Short: "Send messages: each JSON argument, or each line of stdin when there is none",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			headers := map[string]string{}
			for _, h := range sendHeaders {
				k, v, ok := strings.Cut(h, "=")
				if !ok {
					return fmt.Errorf("--header %q: want KEY=VALUE", h)
				}
				headers[k] = v
			}
			payloads := args[1:]
			if len(payloads) == 0 {
				sc := bufio.NewScanner(cmd.InOrStdin())
				sc.Buffer(make([]byte, 1<<20), 64<<20)
				for sc.Scan() {
					if line := strings.TrimSpace(sc.Text()); line != "" {
						payloads = append(payloads, line)
					}
				}
				if err := sc.Err(); err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
			}
			if sendID != "" && len(payloads) != 1 {
				return fmt.Errorf("--id names one message; got %d", len(payloads))
			}
			msgs := make([]messages.OutgoingMessage, len(payloads))
			for i, p := range payloads {
				msgs[i] = messages.OutgoingMessage{Data: json.RawMessage(p), MessageID: sendID, GroupKey: sendGroup, Delay: sendDelay, Headers: headers}
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			res, err := c.Send(cmd.Context(), args[0], msgs...)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), res, func(tw *tabwriter.Writer) {
				row(tw, "OFFSET", "MESSAGE ID", "DUPLICATE")
				for _, r := range res {
					row(tw, r.Offset, r.MessageID, r.Duplicate)
				}
			})
		},
	}
	f = send.Flags()
	f.StringVar(&sendID, "id", "", "message id, for deduplication (default a UUID)")
	f.StringVar(&sendGroup, "group", "", "FIFO group key (FIFO queues)")
	f.DurationVar(&sendDelay, "delay", 0, "keep the messages invisible this long")
	f.StringArrayVar(&sendHeaders, "header", nil, "KEY=VALUE header (repeatable)")

	var (
		recvMax  int
		recvVT   time.Duration
		recvWait time.Duration
		recvAck  bool
	)
	receive := &cobra.Command{
		Use:   "receive QUEUE",
		Short: "Receive (lease) messages and print them; --ack deletes them after printing",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// (--max 0 would lease a message: the library reads 0 as its default, 1.)
			if err := requirePositive(cmd, "max"); err != nil {
				return err
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			msgs, err := c.Receive(cmd.Context(), args[0], &messages.ReceiveOpts{Max: recvMax, VisibilityTimeout: recvVT, Wait: recvWait})
			if err != nil {
				return err
			}
			if msgs == nil {
				msgs = []*messages.Message{}
			}
			if err := printMessages(g, cmd, msgs); err != nil {
				return err
			}
			if recvAck && len(msgs) > 0 {
				rs := make([]messages.Receipt, len(msgs))
				for i, m := range msgs {
					rs[i] = m.Receipt
				}
				return c.Ack(cmd.Context(), rs...)
			}
			return nil
		},
	}
	f = receive.Flags()
	f.IntVarP(&recvMax, "max", "n", 1, "most messages to receive")
	f.DurationVar(&recvVT, "visibility-timeout", 0, "lease (default the queue's)")
	f.DurationVar(&recvWait, "wait", 0, "long poll: wait up to this long for a message")
	f.BoolVar(&recvAck, "ack", false, "ack the messages after printing them")

	stats := &cobra.Command{
		Use:   "stats [QUEUE]",
		Short: "Depth, in flight, delayed, dead-lettered and oldest age, per queue",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			st, err := c.Stats(cmd.Context(), name)
			if err != nil {
				return err
			}
			if st == nil {
				st = []messages.QueueStats{}
			}
			return printStats(g, cmd, st)
		},
	}

	purge := &cobra.Command{
		Use:   "purge QUEUE",
		Short: "Delete every message of a queue, in flight or not",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			n, err := c.Purge(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"queue": args[0], "purged": n}, func(tw *tabwriter.Writer) {
				row(tw, "QUEUE", "PURGED")
				row(tw, args[0], n)
			})
		},
	}

	del := &cobra.Command{
		Use:   "delete QUEUE",
		Short: "Delete a queue and all its messages",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			return c.DeleteQueue(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, list, send, receive, stats, purge, del)
	cmd.AddCommand(newSettleCmds(g)...)
	return cmd
}

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Dead-letter queues: list dead letters, replay them to their origin, discard them",
	}
	var (
		listLimit  int
		listAfter  int64
		listStatus string
		by         string
		ids        []string
	)
	list := &cobra.Command{
		Use:   "list [DLQ]",
		Short: "Without DLQ: the dead-letter queues in use; with DLQ: its dead letters with their provenance (with --status: their records, by status)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			if cmd.Flags().Changed("status") {
				if len(args) == 0 {
					return fmt.Errorf("--status lists one dead-letter queue's records: name it")
				}
				if listStatus == "all" {
					listStatus = ""
				}
				dl, err := c.DeadLetters(cmd.Context(), args[0], listStatus)
				if err != nil {
					return err
				}
				if dl == nil {
					dl = []messages.DeadLetter{}
				}
				return g.print(cmd.OutOrStdout(), dl, func(tw *tabwriter.Writer) {
					row(tw, "MESSAGE ID", "ORIGIN", "ATTEMPTS", "STATUS", "RESOLVED BY", "LAST FAILURE", "ERROR")
					for _, d := range dl {
						row(tw, d.MessageID, d.OriginQueue, d.Attempts, d.Status, orDash(d.ResolvedBy),
							d.LastFailureAt.UTC().Format(time.RFC3339), d.Error)
					}
				})
			}
			if len(args) == 0 {
				all, err := c.Stats(cmd.Context(), "")
				if err != nil {
					return err
				}
				used := map[string]bool{}
				for _, s := range all {
					if s.DeadLetterQueue != "" {
						used[s.DeadLetterQueue] = true
					}
				}
				dlqs := []messages.QueueStats{}
				for _, s := range all {
					if used[s.Queue] {
						dlqs = append(dlqs, s)
					}
				}
				return printStats(g, cmd, dlqs)
			}
			if err := requirePositive(cmd, "limit"); err != nil {
				return err
			}
			msgs, err := c.Peek(cmd.Context(), args[0], &messages.PeekOpts{Limit: listLimit, AfterOffset: listAfter})
			if err != nil {
				return err
			}
			if msgs == nil {
				msgs = []*messages.Message{}
			}
			return printMessages(g, cmd, msgs)
		},
	}
	list.Flags().IntVarP(&listLimit, "limit", "n", 100, "most messages to list")
	list.Flags().Int64Var(&listAfter, "after", 0, "list messages after this offset")
	list.Flags().StringVar(&listStatus, "status", "pending", "list the dead letters' records with this status: pending, replayed, discarded, resolved or all")

	var ro messages.RedriveOpts
	replay := &cobra.Command{
		Use:   "replay DLQ [--id MESSAGE_ID...]",
		Short: "Move dead letters back to the queues they came from (all, in order, at a bounded rate; or those named by --id)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			if len(ids) > 0 {
				return settleDLQ(g, cmd, args[0], "replayed", ids, func() ([]string, error) {
					return c.ReplayDeadLetters(cmd.Context(), args[0], by, ids...)
				})
			}
			if err := requirePositive(cmd, "batch"); err != nil {
				return err
			}
			prog := newProgress(cmd.ErrOrStderr(), g.logger, "dlq replay "+args[0])
			opts := ro
			opts.Progress = func(moved, limit int) { prog.update(moved, limit, false) }
			n, err := c.Redrive(cmd.Context(), args[0], &opts)
			prog.update(n, 0, true)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"dlq": args[0], "replayed": n}, func(tw *tabwriter.Writer) {
				row(tw, "DLQ", "REPLAYED")
				row(tw, args[0], n)
			})
		},
	}
	replay.Flags().IntVar(&ro.Limit, "limit", 0, "most messages to replay (default: the dead letters there when the replay starts)")
	replay.Flags().Float64Var(&ro.Rate, "rate", 100, "most messages per second (0: unbounded)")
	replay.Flags().IntVar(&ro.BatchSize, "batch", 100, "messages per transaction")
	replay.Flags().StringArrayVar(&ids, "id", nil, "replay only the dead letter with this message id (repeatable)")
	replay.Flags().StringVar(&by, "by", envOr("USER", "cli"), "who replays (recorded with --id)")

	var discardAll bool
	discard := &cobra.Command{
		Use:   "discard DLQ [OFFSET... | --id MESSAGE_ID...]",
		Short: "Delete the given dead letters (by offset, or by message id recording who), or all of them with --all",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(ids) > 0 {
				if discardAll || len(args) > 1 {
					return fmt.Errorf("name message ids (--id), offsets or --all, one of them")
				}
				c, done, err := queueClient(cmd, g)
				if err != nil {
					return err
				}
				defer done()
				return settleDLQ(g, cmd, args[0], "discarded", ids, func() ([]string, error) {
					return c.DiscardDeadLetters(cmd.Context(), args[0], by, ids...)
				})
			}
			if discardAll == (len(args) > 1) {
				return fmt.Errorf("name offsets to discard, or --all, not both")
			}
			offs := make([]int64, 0, len(args)-1)
			for _, a := range args[1:] {
				o, err := strconv.ParseInt(a, 10, 64)
				if err != nil || o < 0 {
					return fmt.Errorf("offset %q: want a non-negative integer", a)
				}
				if !slices.Contains(offs, o) {
					offs = append(offs, o)
				}
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			var n int64
			if discardAll {
				// The dead letters there now, page by page, as when named: a message
				// in flight (someone receiving from the dead-letter queue) stays. A
				// purge deleted those too, and emptied any queue named by mistake.
				var after int64
				for {
					page, perr := c.Peek(cmd.Context(), args[0], &messages.PeekOpts{AfterOffset: after, Limit: 1000})
					if perr != nil || len(page) == 0 {
						err = perr
						break
					}
					ids := make([]int64, len(page))
					for i, m := range page {
						ids[i] = m.Offset
					}
					after = ids[len(ids)-1]
					got, derr := c.Discard(cmd.Context(), args[0], ids...)
					if derr != nil {
						err = derr
						break
					}
					n += int64(len(got))
				}
			} else {
				var got []int64
				got, err = c.Discard(cmd.Context(), args[0], offs...)
				n = int64(len(got))
			}
			if err != nil {
				return err
			}
			if err := g.print(cmd.OutOrStdout(), map[string]any{"dlq": args[0], "discarded": n}, func(tw *tabwriter.Writer) {
				row(tw, "DLQ", "DISCARDED")
				row(tw, args[0], n)
			}); err != nil {
				return err
			}
			// As by --id: offsets named and not discarded (not there, or in flight)
			// make the command fail, after it printed what it did.
			if !discardAll && n < int64(len(offs)) {
				return fmt.Errorf("%d of %d dead letters not discarded: not there, or in flight", int64(len(offs))-n, len(offs))
			}
			return nil
		},
	}
	discard.Flags().BoolVar(&discardAll, "all", false, "discard every dead letter not in flight")
	discard.Flags().StringArrayVar(&ids, "id", nil, "discard the dead letter with this message id (repeatable)")
	discard.Flags().StringVar(&by, "by", envOr("USER", "cli"), "who discards (recorded with --id)")

	resolve := &cobra.Command{
		Use:   "resolve DLQ MESSAGE_ID...",
		Short: "Mark dead letters resolved (dealt with by hand, without replay) and delete them from the dead-letter queue",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			return settleDLQ(g, cmd, args[0], "resolved", args[1:], func() ([]string, error) {
				return c.ResolveDeadLetters(cmd.Context(), args[0], by, args[1:]...)
			})
		},
	}
	resolve.Flags().StringVar(&by, "by", envOr("USER", "cli"), "who resolves (recorded)")
	cmd.AddCommand(list, replay, discard, resolve, newRedriveTaskCmd(g))
	return cmd
}

// settleDLQ runs settle (a replay, discard or resolve by message id) and prints the
// ids it settled; the ids it left (in flight, not pending, unknown) are an error.
func settleDLQ(g *globals, cmd *cobra.Command, dlq, status string, ids []string, settle func() ([]string, error)) error {
	got, err := settle()
	if err != nil {
		return err
	}
	if got == nil {
		got = []string{}
	}
	if err := g.print(cmd.OutOrStdout(), map[string]any{"dlq": dlq, status: got}, func(tw *tabwriter.Writer) {
		row(tw, "DLQ", "MESSAGE ID", "STATUS")
		for _, id := range got {
			row(tw, dlq, id, status)
		}
	}); err != nil {
		return err
	}
	if len(got) < len(ids) {
		return fmt.Errorf("%d of %d dead letters not %s: not pending, in flight, unknown, or (replay) their origin queue is gone",
			len(ids)-len(got), len(ids), status)
	}
	return nil
}

func printQueues(g *globals, cmd *cobra.Command, qs []messages.QueueInfo) error {
	if qs == nil {
		qs = []messages.QueueInfo{}
	}
	return g.print(cmd.OutOrStdout(), qs, func(tw *tabwriter.Writer) {
		row(tw, "QUEUE", "FIFO", "VISIBILITY TIMEOUT", "MAX ATTEMPTS", "DEAD-LETTER QUEUE", "MAX PAYLOAD")
		for _, q := range qs {
			dlq := q.DeadLetterQueue
			if dlq == "" {
				dlq = "-"
			}
			row(tw, q.Name, q.FIFO, q.VisibilityTimeout, q.MaxDeliveryAttempts, dlq, q.MaxPayloadBytes)
		}
	})
}

func printStats(g *globals, cmd *cobra.Command, st []messages.QueueStats) error {
	return g.print(cmd.OutOrStdout(), st, func(tw *tabwriter.Writer) {
		row(tw, "QUEUE", "DEPTH", "IN FLIGHT", "DELAYED", "TOTAL", "DEAD-LETTERED", "OLDEST AGE")
		for _, s := range st {
			row(tw, s.Queue, s.Depth, s.InFlight, s.Delayed, s.Total, s.DeadLettered, s.OldestAge.Round(time.Millisecond))
		}
	})
}

func printMessages(g *globals, cmd *cobra.Command, msgs []*messages.Message) error {
	return g.print(cmd.OutOrStdout(), msgs, func(tw *tabwriter.Writer) {
		row(tw, "OFFSET", "MESSAGE ID", "ATTEMPTS", "GROUP", "ORIGIN", "LAST ERROR", "RECEIPT", "DATA")
		for _, m := range msgs {
			origin := "-"
			if m.Origin != nil {
				origin = fmt.Sprintf("%s/%d (%d attempts)", m.Origin.Queue, m.Origin.Offset, m.Origin.Attempts)
			}
			receipt := "-"
			if m.Receipt.LeaseToken != ([16]byte{}) {
				receipt = m.Receipt.String() // what queue ack|nack|extend take
			}
			row(tw, m.Offset, m.MessageID, m.DeliveryAttempts, queueDash(m.GroupKey), origin, queueDash(m.LastError), receipt, string(m.Data))
		}
	})
}

func queueDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
