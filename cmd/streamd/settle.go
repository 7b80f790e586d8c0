package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/messages"
)

// receiptsOf parses receipt handles (QUEUE/OFFSET/TOKEN, as receive prints them).
func receiptsOf(args []string) ([]messages.Receipt, error) {
	out := make([]messages.Receipt, len(args))
	for i, a := range args {
		r, err := messages.ParseReceipt(a)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// newSettleCmds are `streamd queue ack|nack|extend RECEIPT...`: settlement by the
// receipt handles that `queue receive` prints.
func newSettleCmds(g *globals) []*cobra.Command {
	settled := func(cmd *cobra.Command, verb string, rs []messages.Receipt) error {
		return g.print(cmd.OutOrStdout(), map[string]any{verb: len(rs)}, func(tw *tabwriter.Writer) {
			row(tw, "SETTLED", "RECEIPTS")
			row(tw, verb, len(rs))
		})
	}
	ack := &cobra.Command{
		Use:   "ack RECEIPT...",
		Short: "Ack (delete) received messages by their receipts (QUEUE/OFFSET/TOKEN, as receive prints them)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rs, err := receiptsOf(args)
			if err != nil {
				return err
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			if err := c.Ack(cmd.Context(), rs...); err != nil {
				return err
			}
			return settled(cmd, "acked", rs)
		},
	}
	var (
		nackDelay time.Duration
		nackError string
	)
	nack := &cobra.Command{
		Use:   "nack RECEIPT...",
		Short: "Nack received messages: visible again after --delay, the attempt counted",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if nackDelay < 0 {
				return fmt.Errorf("--delay %v: must not be negative", nackDelay)
			}
			rs, err := receiptsOf(args)
			if err != nil {
				return err
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			if err := c.Nack(cmd.Context(), &messages.NackOpts{Delay: nackDelay, Error: nackError}, rs...); err != nil {
				return err
			}
			return settled(cmd, "nacked", rs)
		},
	}
	nack.Flags().DurationVar(&nackDelay, "delay", 0, "keep the messages invisible this long")
	nack.Flags().StringVar(&nackError, "error", "", "recorded as the messages' last error")
	var extendBy time.Duration
	extend := &cobra.Command{
		Use:   "extend RECEIPT...",
		Short: "Extend received messages' leases to --visibility-timeout from now",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requirePositive(cmd, "visibility-timeout"); err != nil {
				return err
			}
			rs, err := receiptsOf(args)
			if err != nil {
				return err
			}
			c, done, err := queueClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			if err := c.Extend(cmd.Context(), extendBy, rs...); err != nil {
				return err
			}
			return settled(cmd, "extended", rs)
		},
	}
	extend.Flags().DurationVar(&extendBy, "visibility-timeout", 30*time.Second, "the new lease, from now")
	return []*cobra.Command{ack, nack, extend}
}
