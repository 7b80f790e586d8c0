package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streamconfig"
)

// newRetentionCmd is `streamd retention apply [--dry-run] [--force] [--stream S]...`.
func newRetentionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retention",
		Short: "Apply retention policies",
	}
	var (
		dryRun bool
		force  bool
		names  []string
		batch  int
	)
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Apply the retention policies now (every enabled one, or --stream)",
		Long: `Applies retention now: deletes each partition's records below its new log start
(by age, count or size) in bounded batches, and compacts streams whose cleanup policy
says so. With --dry-run, reports per partition what would be deleted and deletes
nothing. --force ignores protectConsumers. A stream another streamd instance is
processing is reported as busy and skipped, and the other streams are still applied.
A stream that fails otherwise is reported with its error (and what was deleted before
it), the others are still applied, and the command then exits with an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requirePositive(cmd, "batch-size"); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			r, err := retention.New(pool, &retention.Config{BatchSize: batch, Logger: g.logger})
			if err != nil {
				return err
			}
			results := []appliedStream{}
			failed := 0
			prog := newProgress(cmd.ErrOrStderr(), g.logger, "retention apply")
			_, err = r.RunOnce(ctx, &retention.RunOnceOpts{DryRun: dryRun, Force: force, Streams: names,
				Report: func(stream string, res *retention.StreamResult, err error) {
					a := appliedStream{StreamResult: retention.StreamResult{Stream: stream, DryRun: dryRun, Partitions: []retention.PartitionResult{}}}
					if res != nil {
						a.StreamResult = *res
					}
					switch {
					case err == nil:
					case errors.Is(err, retention.ErrBusy):
						a.Busy = true
					default:
						a.Error = err.Error()
						failed++
					}
					results = append(results, a)
					prog.update(len(results), len(names), false, "stream", stream)
				}})
			prog.update(len(results), len(names), true)
			if err != nil {
				err = fmt.Errorf("retention apply: %d of %d streams failed: %w", failed, len(results), err)
			}
			if perr := g.print(cmd.OutOrStdout(), results, func(tw *tabwriter.Writer) {
				row(tw, "STREAM", "PARTITION", "LOG START", "NEW LOG START", "LOG END", "DELETED", "COMPACTED", "LIMITED BY")
				for _, s := range results {
					// The error itself is the command's error, printed after the table.
					switch {
					case s.Busy:
						row(tw, s.Stream, "busy", "", "", "", "", "", "")
					case s.Error != "":
						row(tw, s.Stream, "failed", "", "", "", "", "", "")
					}
					for _, p := range s.Partitions {
						row(tw, s.Stream, p.Partition, p.LogStartOffset, p.NewLogStartOffset, p.NextOffset, p.Deleted, p.Compacted, p.LimitedBy)
					}
				}
			}); perr != nil {
				return errors.Join(err, perr)
			}
			return err
		},
	}
	apply.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be deleted; delete nothing")
	apply.Flags().BoolVar(&force, "force", false, "ignore protectConsumers (delete below live groups' committed offsets)")
	apply.Flags().StringSliceVar(&names, "stream", nil, "apply only to these streams (repeatable; default every enabled policy)")
	apply.Flags().IntVar(&batch, "batch-size", 10000, "most rows deleted per transaction")
	cmd.AddCommand(apply)
	return cmd
}

// appliedStream is one stream's line of `retention apply`: what was done, or that the
// stream was busy (another runner had it) or failed (with what was deleted before).
type appliedStream struct {
	retention.StreamResult
	Busy  bool   `json:"busy,omitempty"`
	Error string `json:"error,omitempty"`
}

// newStreamConfigCmd is `streamd stream config get|set`, wired under `stream`.
func newStreamConfigCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Get or set a stream's configuration (retention, dead letter, lifecycle, performance, access control, tags)",
	}
	get := &cobra.Command{
		Use:   "get STREAM",
		Short: "Print a stream's configuration: a table of its settings, or with --output json the JSON that set takes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg, err := streamconfig.NewStore(pool).Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printConfig(g, cmd, cfg)
		},
	}
	var (
		file    string
		replace bool
	)
	set := &cobra.Command{
		Use:   "set STREAM [JSON]",
		Short: "Set sections of a stream's configuration from JSON (argument, --file, or stdin with --file -)",
		Long: `Sets a stream's configuration from a JSON object whose keys are the sections:
retention_config, dead_letter_config, lifecycle_config, performance_config,
access_control_config, tags. Sections not given are kept (unless --replace).
Durations take the seed's TimeSpan form ("90.00:00:00"), Go's ("720h") or seconds:

  streamd stream config set orders '{"retention_config": {"maxAge": "90.00:00:00", "maxSizeBytes": 10737418240}}'

The retention limits maxEventCount and maxSizeBytes apply PER PARTITION (seed 003's
max_event_count was per stream): a stream of N partitions keeps up to N times the
count.

A bad field is refused with its name, and nothing is written.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw []byte
			switch {
			case len(args) == 2 && file != "":
				return fmt.Errorf("give the JSON as an argument or with --file, not both")
			case len(args) == 2:
				raw = []byte(args[1])
			case file == "-":
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				raw = b
			case file != "":
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				raw = b
			default:
				return fmt.Errorf("give the configuration JSON as an argument or with --file")
			}
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			store := streamconfig.NewStore(pool)
			cfg := &streamconfig.Config{}
			if !replace {
				if cfg, err = store.Get(cmd.Context(), args[0]); err != nil {
					return err
				}
			}
			// Sections given replace the current ones; a bad one writes nothing.
			if err := cfg.MergeJSON(raw); err != nil {
				return fmt.Errorf("configuration: %w", err)
			}
			if err := store.Set(cmd.Context(), args[0], cfg); err != nil {
				return err
			}
			if cfg, err = store.Get(cmd.Context(), args[0]); err != nil {
				return err
			}
			return printConfig(g, cmd, cfg)
		},
	}
	set.Flags().StringVarP(&file, "file", "f", "", "read the JSON from this file (- for stdin)")
	set.Flags().BoolVar(&replace, "replace", false, "replace the whole configuration (sections not given become empty)")
	cmd.AddCommand(get, set)
	return cmd
}

// printConfig prints a stream's configuration: with --output json as JSON (the form
// stream config set takes), else as a table of its settings, one row each.
func printConfig(g *globals, cmd *cobra.Command, cfg *streamconfig.Config) error {
	if g.output == "json" {
		return printJSON(cmd.OutOrStdout(), cfg)
	}
	// The rows come from the JSON form, so the table names the settings as set takes
	// them and cannot miss a field.
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	var sections map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &sections); err != nil {
		return err
	}
	return g.print(cmd.OutOrStdout(), cfg, func(tw *tabwriter.Writer) {
		row(tw, "SECTION", "SETTING", "VALUE")
		for _, sec := range slices.Sorted(maps.Keys(sections)) {
			for _, k := range slices.Sorted(maps.Keys(sections[sec])) {
				v := string(sections[sec][k])
				var str string
				if json.Unmarshal(sections[sec][k], &str) == nil {
					v = str
				}
				row(tw, sec, k, v)
			}
		}
	})
}

// printJSON writes v as indented JSON (--output json).
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
