package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/streams"
)

// newAdvisoriesCmd prints the advisory stream (docs/advisories.md), a friendlier
// `streamd fetch streamd.advisories`.
func newAdvisoriesCmd(g *globals) *cobra.Command {
	var (
		since  time.Duration
		types  []string
		follow bool
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "advisories",
		Short: "Print streamd's advisories: dead letters, expired and fenced members, rebalances, unread events deleted, resets, tailer and leader changes",
		Long: `Prints the advisories streamd appended to its stream streamd.advisories, one line
each: time, type, key, payload (-o json prints one JSON object per line). The stream
is an ordinary stream: consumer groups, 'streamd fetch streamd.advisories' and Kafka
clients (topic streamd.advisories) read it too. docs/advisories.md lists the types and
their payloads.`,
		Example: `  streamd advisories --since 24h
  streamd advisories --type streamd.group.member_expired --type streamd.group.rebalanced
  streamd advisories --since 0s --follow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, t := range types {
				if !slices.Contains(advisory.Types, t) {
					return fmt.Errorf("--type %q: want one of %v", t, advisory.Types)
				}
			}
			if since < 0 {
				return fmt.Errorf("--since %v: must not be negative", since)
			}
			ctx := cmd.Context()
			pool, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			c := streams.NewClient(pool, nil)
			pos, err := c.OffsetForTime(ctx, advisory.Stream, 0, time.Now().Add(-since))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			printed := 0
			for limit <= 0 || printed < limit {
				opts := &streams.FetchOpts{MaxRecords: 500}
				if follow {
					opts.MaxWait = 10 * time.Second
				}
				res, err := c.Fetch(ctx, advisory.Stream, 0, pos, opts)
				if err != nil {
					if follow && ctx.Err() != nil {
						return nil
					}
					return err
				}
				for _, e := range res.Events {
					if len(types) > 0 && !slices.Contains(types, e.EventType) {
						continue
					}
					if g.output == "json" {
						line, err := json.Marshal(map[string]any{"offset": e.Offset, "timestamp": e.Timestamp,
							"type": e.EventType, "key": e.Key, "data": e.Data})
						if err != nil {
							return err
						}
						fmt.Fprintln(out, string(line))
					} else {
						fmt.Fprintf(out, "%s  %-32s  %s  %s\n", e.Timestamp.UTC().Format(time.RFC3339Nano), e.EventType, e.Key, e.Data)
					}
					printed++
					if limit > 0 && printed >= limit {
						return nil
					}
				}
				pos = res.NextOffset
				if len(res.Events) == 0 && !follow {
					return nil
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&since, "since", time.Hour, "print the advisories of this last span (0s: from now on, with --follow)")
	f.StringArrayVar(&types, "type", nil, "only advisories of this type (repeatable)")
	f.BoolVar(&follow, "follow", false, "keep waiting for new advisories")
	f.IntVar(&limit, "max", 0, "stop after this many advisories (0: no limit)")
	return cmd
}
