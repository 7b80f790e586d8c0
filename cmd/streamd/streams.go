package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/streams"
)

func newStreamCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "Create, list, describe and delete streams",
	}
	var partitions int32
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a stream (an existing one is refused: stream alter grows it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			c := streams.NewClient(pool, nil)
			if err := c.AddStream(cmd.Context(), args[0], partitions); err != nil {
				return err
			}
			info, err := c.DescribeStream(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printStream(g, cmd, info)
		},
	}
	create.Flags().Int32Var(&partitions, "partitions", 1, "number of partitions (-p is --partition, a partition number, everywhere)")

	var grow, maxPayload int32
	alter := &cobra.Command{
		Use:   "alter NAME [--partitions N] [--max-payload BYTES]",
		Short: "Grow a stream to N partitions (keys re-map to partitions by the new count), or set its payload limit",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			if !fl.Changed("partitions") && !fl.Changed("max-payload") {
				return fmt.Errorf("give --partitions (the new partition count) or --max-payload (the payload limit in bytes)")
			}
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			c := streams.NewClient(pool, nil)
			// Both or neither: the limit set before a refused grow stayed set.
			opts := &streams.AlterStreamOpts{}
			if fl.Changed("max-payload") {
				opts.MaxPayloadBytes = &maxPayload
			}
			if fl.Changed("partitions") {
				opts.Partitions = &grow
			}
			if err := c.AlterStream(cmd.Context(), args[0], opts); err != nil {
				return err
			}
			info, err := c.DescribeStream(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printStream(g, cmd, info)
		},
	}
	alter.Flags().Int32Var(&grow, "partitions", 0, "the new partition count (more than now)")
	alter.Flags().Int32Var(&maxPayload, "max-payload", 0, "the largest event payload in bytes (data, bytes and headers)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List streams",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			all, err := streams.NewClient(pool, nil).ListStreams(cmd.Context())
			if err != nil {
				return err
			}
			if all == nil {
				all = []streams.StreamInfo{}
			}
			return g.print(cmd.OutOrStdout(), all, func(tw *tabwriter.Writer) {
				row(tw, "STREAM", "PARTITIONS", "MAX PAYLOAD", "CREATED")
				for _, s := range all {
					row(tw, s.Name, s.Partitions, s.MaxPayloadBytes, s.CreatedAt.Format(time.RFC3339))
				}
			})
		},
	}

	describe := &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a stream's partitions with their log start and end offsets",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			info, err := streams.NewClient(pool, nil).DescribeStream(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printStream(g, cmd, info)
		},
	}

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a stream and all its events",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			return streams.NewClient(pool, nil).DeleteStream(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, alter, list, describe, del, newStreamConfigCmd(g), newStreamReadByCmd(g), newStreamIndexCmd(g))
	return cmd
}

func printStream(g *globals, cmd *cobra.Command, info *streams.StreamInfo) error {
	return g.print(cmd.OutOrStdout(), info, func(tw *tabwriter.Writer) {
		row(tw, "STREAM", "PARTITION", "LOG START", "LOG END", "RETAINED", "LAST APPEND")
		for _, p := range info.PartitionInfo {
			last := "-"
			if p.LastAppendedAt != nil {
				last = p.LastAppendedAt.Format(time.RFC3339Nano)
			}
			row(tw, info.Name, p.Partition, p.LogStartOffset, p.NextOffset, p.NextOffset-p.LogStartOffset, last)
		}
	})
}

func newProduceCmd(g *globals) *cobra.Command {
	var (
		key       string
		partition int32
		eventType string
		raw       bool
		asString  bool
		keyDelim  string
		headers   []string
	)
	cmd := &cobra.Command{
		Use:   "produce STREAM",
		Short: "Append each line of stdin as a record",
		Long: `Appends each line of standard input as one record of STREAM. Each line must be
valid JSON, stored as the record's JSON data; a line that is not is refused (named by
its number; the other lines are still produced and the command then fails), unless
--string stores every line as a JSON string or --raw as a binary payload. Empty lines
are skipped, and said so on stderr. With --key-delimiter, the text before the first
delimiter of each line is the record's key (kcat's -K). Records are batched by a
Producer; each position is printed after its batch committed.`,
		Example: `  echo '{"order":1}' | streamd produce orders --key customer-7 --type OrderPlaced`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			hdr := map[string]string{}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return fmt.Errorf("--header %q: want key=value", h)
				}
				hdr[k] = v
			}
			prod, err := streams.NewProducer(pool, &streams.ProducerConfig{Logger: g.logger})
			if err != nil {
				return err
			}
			if raw && asString {
				return errors.New("--raw and --string contradict each other: choose one")
			}
			if keyDelim != "" && cmd.Flags().Changed("key") {
				return errors.New("--key and --key-delimiter contradict each other: choose one")
			}
			type result struct {
				pos     streams.Position
				err     error
				skipped bool
			}
			var pending []chan result
			// Each line is a record, and a bad line fails alone, reported with its
			// number; that includes a line over maxLine, which is skipped to its end
			// (a bufio.Scanner stopped reading there, leaving the rest unsent and the
			// records before it unreported).
			const maxLine = 16 << 20
			rd := bufio.NewReaderSize(cmd.InOrStdin(), 64*1024)
			var readErr error
			for {
				line, tooLong, err := readLine(rd, maxLine)
				if err != nil {
					if !errors.Is(err, io.EOF) {
						readErr = err
					}
					if line == nil && !tooLong {
						break
					}
				}
				if tooLong {
					ch := make(chan result, 1)
					ch <- result{err: fmt.Errorf("line longer than %d bytes: not sent", maxLine)}
					pending = append(pending, ch)
					if err != nil {
						break
					}
					continue
				}
				if len(bytes.TrimSpace(line)) == 0 {
					ch := make(chan result, 1)
					ch <- result{skipped: true}
					pending = append(pending, ch)
					if err != nil {
						break
					}
					continue
				}
				rec := streams.Record{Stream: args[0], Key: key, EventType: eventType}
				if keyDelim != "" {
					k, rest, ok := bytes.Cut(line, []byte(keyDelim))
					if !ok {
						ch := make(chan result, 1)
						ch <- result{err: fmt.Errorf("no key delimiter %q: not sent", keyDelim)}
						pending = append(pending, ch)
						if err != nil {
							break
						}
						continue
					}
					rec.Key, line = string(k), rest
				}
				if len(hdr) > 0 {
					rec.Headers = hdr
				}
				if cmd.Flags().Changed("partition") {
					rec.Partition = streams.PartitionOf(partition)
				}
				invalidJSON := false
				switch {
				case raw:
					rec.Bytes = append([]byte(nil), line...)
				case asString:
					b, _ := json.Marshal(string(line))
					rec.Data = b
				case json.Valid(line):
					rec.Data = append(json.RawMessage(nil), line...)
				default:
					invalidJSON = true
				}
				if invalidJSON {
					ch := make(chan result, 1)
					ch <- result{err: errors.New("not valid JSON: not sent (--string stores lines as JSON strings, --raw as bytes)")}
					pending = append(pending, ch)
					if err != nil {
						break
					}
					continue
				}
				ch := make(chan result, 1)
				prod.ProduceAsync(ctx, rec, func(p streams.Position, err error) { ch <- result{pos: p, err: err} })
				pending = append(pending, ch)
				if err != nil {
					break
				}
			}
			closeErr := prod.Close(ctx)
			enc := json.NewEncoder(cmd.OutOrStdout())
			failed, skipped := 0, 0
			for i, ch := range pending {
				r := <-ch
				if r.skipped {
					skipped++
					fmt.Fprintf(cmd.ErrOrStderr(), "line %d: empty: skipped\n", i+1)
					continue
				}
				if r.err != nil {
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "line %d: %v\n", i+1, r.err)
					continue
				}
				if g.output == "json" {
					_ = enc.Encode(r.pos)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "%s/%d@%d\n", args[0], r.pos.Partition, r.pos.Offset)
				}
			}
			if readErr != nil {
				return fmt.Errorf("read stdin after line %d: %w", len(pending), readErr)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d records failed", failed, len(pending)-skipped)
			}
			return closeErr
		},
	}
	f := cmd.Flags()
	f.StringVarP(&key, "key", "k", "", "record key (routes to a partition)")
	f.Int32VarP(&partition, "partition", "p", 0, "explicit partition (default: by key, else sticky)")
	f.StringVarP(&eventType, "type", "t", "", "event type")
	f.BoolVar(&raw, "raw", false, "store lines as binary payloads (data_bytes) instead of JSON")
	f.BoolVar(&asString, "string", false, "store each line as a JSON string (any text)")
	f.StringVarP(&keyDelim, "key-delimiter", "K", "", "the text before this delimiter on each line is the key (kcat -K)")
	f.StringArrayVarP(&headers, "header", "H", nil, "header key=value (repeatable)")
	return cmd
}

// readLine reads one line (without its "\n" or "\r\n") of at most max bytes. A longer
// line is read to its end and dropped: tooLong, and a nil line. At the end of the input
// it returns io.EOF, with the last line when it had no newline.
func readLine(rd *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, isPrefix, err := rd.ReadLine()
		if !tooLong {
			if len(line)+len(chunk) > max {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if err != nil {
			if tooLong {
				return nil, true, err
			}
			if len(line) == 0 {
				return nil, false, err
			}
			return line, false, err
		}
		if !isPrefix {
			if tooLong {
				return nil, true, nil
			}
			if line == nil {
				line = []byte{}
			}
			return line, false, nil
		}
	}
}
