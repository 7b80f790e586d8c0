package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/streams"
)

// What fetch and consume share, in kcat's terms: where reading starts (-o), how each
// record is printed (-f, or the output flag) and the end-of-partition notice.

// offsetKind is what an -o value names.
type offsetKind int

const (
	offsetStored    offsetKind = iota // -o stored, or no -o: fetch reads from the log start, consume from the committed offset
	offsetBeginning                   // -o beginning: the log start
	offsetEnd                         // -o end: the log end (only records appended from now on)
	offsetAbsolute                    // -o N
	offsetFromEnd                     // -o -N: N records before the log end
	offsetTime                        // -o @T or s@T: the first record at or after T
)

// offsetSpec is a parsed -o value.
type offsetSpec struct {
	kind offsetKind
	n    int64     // offsetAbsolute: the offset; offsetFromEnd: how many before the end
	t    time.Time // offsetTime
}

const offsetHelp = "beginning, end, an offset N, -N (N records before the end), or @T (a time: milliseconds since the epoch or RFC 3339)"

// parseOffset parses kcat's -o values: beginning | end | stored | N | -N | @T | s@T,
// where T is milliseconds since the epoch or an RFC 3339 time. (kcat's e@T, stop at a
// time, is refused: say so rather than read on.)
func parseOffset(s string) (offsetSpec, error) {
	bad := func(why string) (offsetSpec, error) {
		return offsetSpec{}, fmt.Errorf("--offset %q: %s; want %s", s, why, offsetHelp)
	}
	switch s {
	case "beginning":
		return offsetSpec{kind: offsetBeginning}, nil
	case "end":
		return offsetSpec{kind: offsetEnd}, nil
	case "stored":
		return offsetSpec{kind: offsetStored}, nil
	}
	if strings.HasPrefix(s, "e@") {
		return bad("stopping at a time (kcat's e@) is not supported")
	}
	if v, ok := strings.CutPrefix(s, "@"); ok {
		return parseOffsetTime(s, v)
	}
	if v, ok := strings.CutPrefix(s, "s@"); ok {
		return parseOffsetTime(s, v)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return bad("not a position")
	}
	if strings.HasPrefix(s, "-") {
		return offsetSpec{kind: offsetFromEnd, n: -n}, nil
	}
	return offsetSpec{kind: offsetAbsolute, n: n}, nil
}

func parseOffsetTime(s, v string) (offsetSpec, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return offsetSpec{kind: offsetTime, t: time.UnixMilli(ms)}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return offsetSpec{}, fmt.Errorf("--offset %q: %q is neither milliseconds since the epoch nor an RFC 3339 time (2026-11-22T10:00:00Z)", s, v)
	}
	return offsetSpec{kind: offsetTime, t: t}, nil
}

// resolve returns the offset the spec names in partition p, clamped to the stored log
// [log start, log end]: an offset retention deleted starts at the log start, one past
// the end at the end (kcat's auto.offset.reset does the same).
func (o offsetSpec) resolve(ctx context.Context, c *streams.Client, stream string, p streams.PartitionInfo) (int64, error) {
	var off int64
	switch o.kind {
	case offsetStored, offsetBeginning:
		off = p.LogStartOffset
	case offsetEnd:
		off = p.NextOffset
	case offsetAbsolute:
		off = o.n
	case offsetFromEnd:
		off = p.NextOffset - o.n
	case offsetTime:
		t, err := c.OffsetForTime(ctx, stream, p.Partition, o.t)
		if err != nil {
			return 0, err
		}
		off = t
	}
	return max(p.LogStartOffset, min(p.NextOffset, off)), nil
}

// recordPrinter prints records as a kcat format string (-f), JSON lines or a table.
// Safe for concurrent use: consume's handlers of different partitions print through
// one printer, a record at a time.
type recordPrinter struct {
	mu      sync.Mutex
	w       io.Writer
	format  []formatPiece // -f; nil for JSON lines or the table
	table   bool
	tw      *tabwriter.Writer
	headers bool // the table's header line was printed
}

// newRecordPrinter prints with format when it is not "", else by the output flag:
// table, or JSON lines (json, and the default of the commands that print records).
func newRecordPrinter(w io.Writer, output, format string) (*recordPrinter, error) {
	p := &recordPrinter{w: w}
	if format != "" && output != "" {
		return nil, fmt.Errorf("--format and --output %s both say how to print: choose one", output)
	}
	if format != "" {
		pieces, err := parseFormat(format)
		if err != nil {
			return nil, err
		}
		p.format = pieces
		return p, nil
	}
	if output == "table" {
		p.table = true
		p.tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	}
	return p, nil
}

// print writes evs, in order. A table is flushed after each call (each batch), so
// columns line up within a batch.
func (p *recordPrinter) print(evs []streams.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.format != nil:
		var b []byte
		for i := range evs {
			b = appendFormatted(b[:0], p.format, &evs[i])
			if _, err := p.w.Write(b); err != nil {
				return err
			}
		}
		return nil
	case p.table:
		if !p.headers {
			row(p.tw, "PARTITION", "OFFSET", "TIMESTAMP", "KEY", "EVENT TYPE", "DATA")
			p.headers = true
		}
		for i := range evs {
			e := &evs[i]
			row(p.tw, e.Partition, e.Offset, e.Timestamp.Format(time.RFC3339Nano), dash(e.Key), dash(e.EventType), payloadText(e))
		}
		return p.tw.Flush()
	default:
		enc := json.NewEncoder(p.w)
		for i := range evs {
			if err := enc.Encode(&evs[i]); err != nil {
				return err
			}
		}
		return nil
	}
}

// payloadText is an event's payload for the table: its JSON data, else its bytes
// quoted.
func payloadText(e *streams.Event) string {
	if e.Bytes != nil {
		return strconv.Quote(string(e.Bytes))
	}
	return string(e.Data)
}

// formatPiece is literal text or one kcat token (%s, %k, ...).
type formatPiece struct {
	lit   string
	token byte // 0 for literal text
}

const formatHelp = "%s payload, %S payload length, %k key, %K key length, %t stream, %p partition, %o offset, %T timestamp (ms), %h headers, %% a percent sign; \\n \\r \\t \\\\"

// parseFormat compiles a kcat -f format string: its tokens %s %S %k %K %t %p %o %T %h
// and %%, and the escapes \n \r \t \\ (any other backslash is kept as written).
func parseFormat(f string) ([]formatPiece, error) {
	var out []formatPiece
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			out = append(out, formatPiece{lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(f); i++ {
		c := f[i]
		switch {
		case c == '\\' && i+1 < len(f) && strings.IndexByte(`nrt\`, f[i+1]) >= 0:
			i++
			lit.WriteByte(map[byte]byte{'n': '\n', 'r': '\r', 't': '\t', '\\': '\\'}[f[i]])
		case c == '%':
			if i+1 == len(f) {
				return nil, fmt.Errorf("--format %q: ends with a lone %%; tokens: %s", f, formatHelp)
			}
			i++
			switch t := f[i]; t {
			case '%':
				lit.WriteByte('%')
			case 's', 'S', 'k', 'K', 't', 'p', 'o', 'T', 'h':
				flush()
				out = append(out, formatPiece{token: t})
			default:
				return nil, fmt.Errorf("--format %q: unknown token %%%c; tokens: %s", f, t, formatHelp)
			}
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return out, nil
}

// appendFormatted appends e formatted by pieces to b. The payload (%s) is the event's
// bytes when it has them (records from Kafka clients, produce --raw), else its JSON
// data as stored; a key or payload that is absent has length -1 (%K, %S), as in kcat.
func appendFormatted(b []byte, pieces []formatPiece, e *streams.Event) []byte {
	for _, pc := range pieces {
		switch pc.token {
		case 0:
			b = append(b, pc.lit...)
		case 's':
			if e.Bytes != nil {
				b = append(b, e.Bytes...)
			} else {
				b = append(b, e.Data...)
			}
		case 'S':
			n := -1
			if e.Bytes != nil {
				n = len(e.Bytes)
			} else if e.Data != nil {
				n = len(e.Data)
			}
			b = strconv.AppendInt(b, int64(n), 10)
		case 'k':
			b = append(append(b, e.Key...), e.KeyBytes...) // at most one is set
		case 'K':
			n := -1
			if e.Key != "" {
				n = len(e.Key)
			} else if e.KeyBytes != nil { // a Kafka key that is not text, or an empty one
				n = len(e.KeyBytes)
			}
			b = strconv.AppendInt(b, int64(n), 10)
		case 't':
			b = append(b, e.Stream...)
		case 'p':
			b = strconv.AppendInt(b, int64(e.Partition), 10)
		case 'o':
			b = strconv.AppendInt(b, e.Offset, 10)
		case 'T':
			b = strconv.AppendInt(b, e.Timestamp.UnixMilli(), 10)
		case 'h':
			b = appendHeaders(b, e)
		}
	}
	return b
}

// appendHeaders appends e's headers as kcat's %h does: key=value, comma-separated, in
// the order appended (RawHeaders), else by key.
func appendHeaders(b []byte, e *streams.Event) []byte {
	if len(e.RawHeaders) > 0 {
		for i, h := range e.RawHeaders {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(append(append(b, h.Key...), '='), h.Value...)
		}
		return b
	}
	keys := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, k...), '='), e.Headers[k]...)
	}
	return b
}

// endNotice writes kcat's end-of-partition line to w (stderr): "% Reached end of
// stream S [P] at offset X", with ": exiting" when it is the last one before exiting.
func endNotice(w io.Writer, stream string, partition int32, offset int64, exiting bool) {
	suffix := ""
	if exiting {
		suffix = ": exiting"
	}
	fmt.Fprintf(w, "%% Reached end of stream %s [%d] at offset %d%s\n", stream, partition, offset, suffix)
}

// streamArg is the stream a command reads: its argument, or the hidden --stream of
// older scripts (the same stream given both ways is accepted).
func streamArg(cmd *cobra.Command, args []string, flagValue string) (string, error) {
	switch {
	case len(args) == 1 && cmd.Flags().Changed("stream") && flagValue != args[0]:
		return "", fmt.Errorf("two streams given (%q and --stream %q): give the stream once, as the argument", args[0], flagValue)
	case len(args) == 1:
		return args[0], nil
	case flagValue != "":
		return flagValue, nil
	}
	return "", fmt.Errorf("give the stream: %s", cmd.UseLine())
}

// readFlags are the kcat-style reading flags of fetch and consume.
type readFlags struct {
	offset  string
	count   int
	exitEOF bool
	format  string
}

func (r *readFlags) register(cmd *cobra.Command, offsetUsage string) {
	f := cmd.Flags()
	f.StringVarP(&r.offset, "offset", "o", "", offsetUsage)
	f.IntVarP(&r.count, "count", "c", 0, "exit after printing this many records (0: no limit)")
	f.BoolVarP(&r.exitEOF, "exit", "e", false, "exit when every partition is at its end (kcat -e)")
	f.StringVarP(&r.format, "format", "f", "", "print each record with this kcat format string: "+formatHelp)
}

// parse checks the flags and returns the -o spec (stored when -o was not given).
func (r *readFlags) parse() (offsetSpec, error) {
	if r.count < 0 {
		return offsetSpec{}, fmt.Errorf("--count %d: must be 0 (no limit) or more", r.count)
	}
	if r.offset == "" {
		return offsetSpec{kind: offsetStored}, nil
	}
	return parseOffset(r.offset)
}
