package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/consumergroup"
)

// newGroupOffsetsCmd is `streamd groups offsets export GROUP [--stream S]`: a group's
// committed offsets as the CSV that `groups reset-offsets --from-file` reads back.
func newGroupOffsetsCmd(g *globals, stream *string) *cobra.Command {
	cmd := &cobra.Command{Use: "offsets", Short: "Export a group's committed offsets (reset-offsets --from-file reads them back)"}
	export := &cobra.Command{
		Use:   "export GROUP",
		Short: "Print a group's committed offsets as stream,partition,offset lines (kafka-consumer-groups --export)",
		Long: `Prints GROUP's committed offsets, on every stream it has (or on --stream), as CSV lines
stream,partition,offset with no header, as kafka-consumer-groups --export prints them
(topic,partition,offset); --output json prints them as JSON. Partitions without a
committed offset are left out. streamd groups reset-offsets GROUP --from-file F sets
them back (a preview unless --execute):

  streamd groups offsets export billing > billing.csv
  streamd groups reset-offsets billing --from-file billing.csv --execute`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			offs, err := consumergroup.NewAdmin(pool).ExportOffsets(cmd.Context(), *stream, args[0])
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(cmd.OutOrStdout(), offs)
			}
			w := csv.NewWriter(cmd.OutOrStdout())
			for _, o := range offs {
				_ = w.Write([]string{o.Stream, strconv.Itoa(int(o.Partition)), strconv.FormatInt(o.Offset, 10)})
			}
			w.Flush()
			return w.Error()
		},
	}
	cmd.AddCommand(export)
	return cmd
}

// resetFromFile is groups reset-offsets GROUP --from-file F: it sets the offsets F
// lists, all or nothing, previewing unless execute.
func resetFromFile(ctx context.Context, g *globals, a *consumergroup.Admin, cmd *cobra.Command, stream, group, file string, execute, force bool) error {
	var r io.Reader
	if file == "-" {
		r = cmd.InOrStdin()
	} else {
		f, err := os.Open(file)
		if err != nil {
			return fmt.Errorf("--from-file: %w", err)
		}
		defer f.Close()
		r = f
	}
	offs, err := parseOffsetsCSV(r, file, group)
	if err != nil {
		return err
	}
	if stream != "" {
		for _, o := range offs {
			if o.Stream != stream {
				return fmt.Errorf("--from-file %s names stream %s, and --stream is %s: the file must name only --stream, or leave --stream out", file, o.Stream, stream)
			}
		}
	}
	changes, err := a.SetOffsets(ctx, group, offs, &consumergroup.SetOffsetsOpts{DryRun: !execute, Force: force})
	if err != nil {
		return err
	}
	if !execute {
		fmt.Fprintln(cmd.ErrOrStderr(), "preview only: nothing changed; add --execute to reset the offsets")
	}
	return g.print(cmd.OutOrStdout(), changes, func(tw *tabwriter.Writer) {
		row(tw, "STREAM", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET")
		for _, c := range changes {
			row(tw, c.Stream, c.Partition, committed(c.Previous), c.New)
		}
	})
}

// parseOffsetsCSV reads stream,partition,offset lines (kafka-consumer-groups' export;
// its group,topic,partition,offset lines of several groups too, of which the group's
// must be the only ones). A header line (stream or topic,partition,offset) is skipped.
// A bad line is named by its number, and nothing is read past it.
func parseOffsetsCSV(r io.Reader, name, group string) ([]consumergroup.GroupOffset, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	var out []consumergroup.GroupOffset
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("--from-file %s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("--from-file %s line %d: %s (want stream,partition,offset)", name, line, fmt.Sprintf(format, args...))
		}
		switch len(rec) {
		case 3:
		case 4:
			if rec[0] != group {
				return nil, bad("group %q is not %q", rec[0], group)
			}
			rec = rec[1:]
		default:
			return nil, bad("%d fields", len(rec))
		}
		if len(out) == 0 && strings.EqualFold(rec[1], "partition") {
			continue // a header
		}
		p, err := strconv.ParseInt(strings.TrimSpace(rec[1]), 10, 32)
		if err != nil || p < 0 {
			return nil, bad("partition %q is not a partition number", rec[1])
		}
		o, err := strconv.ParseInt(strings.TrimSpace(rec[2]), 10, 64)
		if err != nil || o < 0 {
			return nil, bad("offset %q is not an offset", rec[2])
		}
		out = append(out, consumergroup.GroupOffset{Stream: strings.TrimSpace(rec[0]), Partition: int32(p), Offset: o})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--from-file %s: no offsets in it", name)
	}
	return out, nil
}
