package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/streams"
)

// lockedBuffer is a bytes.Buffer that a command writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runTo executes the CLI in-process like run, writing stdout and stderr to the given
// writers.
func runTo(t *testing.T, ctx context.Context, stdout, stderr io.Writer, stdin string, args ...string) error {
	t.Helper()
	cmd := newRootCmd()
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(append([]string{"--database-url", testdb.URL(t)}, args...))
	return cmd.ExecuteContext(ctx)
}

// runSplit is run with stdout and stderr apart.
func runSplit(t *testing.T, ctx context.Context, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := runTo(t, ctx, &out, &errOut, stdin, args...)
	return out.String(), errOut.String(), err
}

// TestCLIFetchReadsAsKcat: fetch takes kcat's -o (beginning, end, N, -N, @ms, @RFC
// 3339), -c, -e, -f with kcat's tokens, -p, and --follow with kcat's end-of-partition
// notices on stderr; --output table|json is honoured; produce takes -K: as kcat does.
func TestCLIFetchReadsAsKcat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.Name("kcat-fetch")
	_, err := run(t, ctx, "", "stream", "create", s, "--partitions", "2")
	require.NoError(t, err)
	out, err := run(t, ctx, "a:0\nb:1\n", "produce", s, "-K:", "-p", "0", "-H", "h=v")
	require.NoError(t, err, out)
	out, err = run(t, ctx, "c:2\nd:3\ne:4\n", "produce", s, "-K:", "-p", "0")
	require.NoError(t, err, out)
	out, err = run(t, ctx, "hello\n", "produce", s, "-p", "1", "--raw")
	require.NoError(t, err, out)

	out, errOut, err := runSplit(t, ctx, "", "fetch", s, "-o", "beginning", "-e", "-f", `%t %p@%o %k=%s|%K|%S|%h\n`)
	require.NoError(t, err, errOut)
	require.Equal(t, fmt.Sprintf("%[1]s 0@0 a=0|1|1|h=v\n%[1]s 0@1 b=1|1|1|h=v\n%[1]s 0@2 c=2|1|1|\n%[1]s 0@3 d=3|1|1|\n%[1]s 0@4 e=4|1|1|\n%[1]s 1@0 =hello|-1|5|\n", s), out)
	require.Equal(t, fmt.Sprintf("%% Reached end of stream %[1]s [0] at offset 5\n%% Reached end of stream %[1]s [1] at offset 1: exiting\n", s), errOut)

	offsets := func(args ...string) string {
		t.Helper()
		out, err := run(t, ctx, "", append([]string{"fetch", s, "-f", `%p@%o\n`}, args...)...)
		require.NoError(t, err, out)
		return strings.ReplaceAll(strings.TrimSpace(out), "\n", " ")
	}
	require.Equal(t, "0@3 0@4", offsets("-p", "0", "-o", "-2"), "-N: N before the end")
	require.Equal(t, "0@4 1@0", offsets("-o", "-1"), "-N in every partition")
	require.Equal(t, "0@3 0@4", offsets("-p", "0", "-o", "3"))
	require.Equal(t, "", offsets("-p", "0", "-o", "99"), "past the end: the end")
	require.Equal(t, "", offsets("-o", "end"))
	require.Equal(t, "0@0 0@1 0@2", offsets("-c", "3"))
	require.Equal(t, "0@0 0@1", offsets("--max", "2"), "--max, -c's former name")

	// @T: the first record at or after T, as RFC 3339 or milliseconds.
	res, err := streams.NewClient(testdb.Pool(t), nil).Fetch(ctx, s, 0, 2, nil)
	require.NoError(t, err)
	require.Equal(t, "0@2 0@3 0@4", offsets("-p", "0", "-o", "@"+res.Events[0].Timestamp.Format(time.RFC3339Nano)),
		"records 2 to 4 came in a later transaction than 0 and 1, so with later timestamps")
	require.Equal(t, "0@0 0@1 0@2 0@3 0@4", offsets("-p", "0", "-o", "s@0"))
	require.Equal(t, "", offsets("-o", "@"+strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)))

	// --output: JSON lines (the default here) or a table.
	out, err = run(t, ctx, "", "fetch", s, "-p", "1", "-O", "json")
	require.NoError(t, err)
	var ev streams.Event
	require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
	require.Equal(t, []byte("hello"), ev.Bytes)
	out, err = run(t, ctx, "", "fetch", s, "-p", "0", "-O", "table")
	require.NoError(t, err)
	require.Regexp(t, `PARTITION\s+OFFSET\s+TIMESTAMP\s+KEY\s+EVENT TYPE\s+DATA`, out)
	require.Regexp(t, `(?m)^0\s+4\s+\S+\s+e\s+-\s+4$`, out)

	// Bad input names the flag and what it takes.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "bogus"}, `--offset "bogus": not a position; want beginning, end`},
		{[]string{"-o", "@yesterday"}, "neither milliseconds since the epoch nor an RFC 3339 time"},
		{[]string{"-o", "e@1"}, "not supported"},
		{[]string{"-o", "stored"}, "fetch reads without a group"},
		{[]string{"-f", "%x"}, "unknown token %x"},
		{[]string{"-p", "5"}, "has partitions 0 to 1"},
		{[]string{"--follow", "-e"}, "contradict"},
		{[]string{"-f", "%s", "-O", "json"}, "choose one"},
		{[]string{"-c", "-1"}, "--count -1"},
		{[]string{"-o", "1", "--from-time", "2026-01-01T00:00:00Z"}, "give one"},
	} {
		_, err := run(t, ctx, "", append([]string{"fetch", s}, c.args...)...)
		require.ErrorContains(t, err, c.want, c.args)
	}

	// --follow: from the end of every partition, waiting for new records; each
	// partition's end is announced on stderr, once each time it gets there.
	var fout, ferr lockedBuffer
	done := make(chan error, 1)
	go func() { // owner: the test; ends at -c 1
		done <- runTo(t, ctx, &fout, &ferr, "", "fetch", s, "--follow", "-o", "end", "-c", "1", "-f", `%p@%o %s\n`)
	}()
	testdb.WaitFor(t, 30*time.Second, "both partitions' end notices", func() bool {
		return strings.Contains(ferr.String(), "stream "+s+" [0] at offset 5") && strings.Contains(ferr.String(), "stream "+s+" [1] at offset 1")
	})
	out, err = run(t, ctx, "7\n", "produce", s, "-p", "1")
	require.NoError(t, err, out)
	select {
	case err := <-done:
		require.NoError(t, err, ferr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("fetch --follow -c 1 did not end after a record arrived")
	}
	require.Equal(t, "1@1 7\n", fout.String())
}

// TestCLIConsumeReadsAsKcat: consume takes the stream as its argument (--stream still
// works), -G, -c N committing exactly the N records printed (it committed the rest of
// the batch, which the group then never read), -e exiting once every partition is at
// its end, and -o overriding the group's committed offset as kcat -G -o does.
func TestCLIConsumeReadsAsKcat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, group := testdb.Name("kcat-consume"), testdb.Name("g")
	_, err := run(t, ctx, "", "stream", "create", s)
	require.NoError(t, err)
	out, err := run(t, ctx, "0\n1\n2\n3\n4\n", "produce", s)
	require.NoError(t, err, out)
	admin := consumergroup.NewAdmin(testdb.Pool(t))
	committedAt := func() int64 {
		t.Helper()
		d, err := admin.DescribeGroup(ctx, s, group)
		require.NoError(t, err)
		require.NotNil(t, d.PartitionStatus[0].CommittedOffset)
		return *d.PartitionStatus[0].CommittedOffset
	}
	consume := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, err := runSplit(t, ctx, "", append([]string{"consume", "-f", `%o\n`}, args...)...)
		require.NoError(t, err, errOut)
		return strings.ReplaceAll(strings.TrimSpace(out), "\n", " "), errOut
	}

	out, _ = consume(s, "-G", group, "-c", "2")
	require.Equal(t, "0 1", out)
	require.Equal(t, int64(2), committedAt(), "-c 2 commits the two printed, not the whole batch of five")
	out, errOut := consume(s, "--group", group, "-e")
	require.Equal(t, "2 3 4", out, "the group goes on where -c stopped")
	require.Contains(t, errOut, "% Reached end of stream "+s+" [0] at offset 5")
	out, _ = consume(s, "-G", group, "-o", "beginning", "-e")
	require.Equal(t, "0 1 2 3 4", out, "-o overrides the committed offset")
	out, _ = consume("--stream", s, "-G", group, "-o", "-1", "-e")
	require.Equal(t, "4", out, "--stream, the argument's former flag")
	out, _ = consume(s, "-G", group, "-o", "end", "-e")
	require.Equal(t, "", out)
	require.Equal(t, int64(5), committedAt())

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-G", group}, "give the stream"},
		{[]string{s, "--stream", "other", "-G", group}, "two streams given"},
		{[]string{s}, "--group is required"},
		{[]string{s, "-G", group, "-o", "later"}, `--offset "later"`},
	} {
		_, err := run(t, ctx, "", append([]string{"consume"}, c.args...)...)
		require.ErrorContains(t, err, c.want, c.args)
	}
}

// TestCLIStreamConfigHonoursOutput: stream config get and set print a table of the
// settings by default and the JSON that set takes with -O json (they printed JSON
// whatever --output said).
func TestCLIStreamConfigHonoursOutput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.Name("cfg-out")
	_, err := run(t, ctx, "", "stream", "create", s)
	require.NoError(t, err)
	out, err := run(t, ctx, "", "stream", "config", "set", s, `{"retention_config": {"maxEventCount": 4, "maxAge": "1.00:00:00"}, "tags": {"team": "billing"}}`)
	require.NoError(t, err, out)
	require.Regexp(t, `SECTION\s+SETTING\s+VALUE`, out)
	require.Regexp(t, `(?m)^retention_config\s+maxEventCount\s+4$`, out)
	require.Regexp(t, `(?m)^tags\s+team\s+billing$`, out)
	out, err = run(t, ctx, "", "stream", "config", "get", s, "-O", "table")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^retention_config\s+maxAge\s+1\.00:00:00$`, out)
	out, err = run(t, ctx, "", "stream", "config", "get", s, "-O", "json")
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &cfg), out)
	require.Contains(t, cfg, "retention_config")
}

// TestCLIGroupsAllGroupsExportAndFromFile: groups describe --all-groups describes every
// group; groups offsets export prints kafka-consumer-groups' CSV, which
// reset-offsets --from-file reads back: a preview by default, the reset with
// --execute, all or nothing.
func TestCLIGroupsAllGroupsExportAndFromFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, g1, g2 := testdb.Name("grp-file"), testdb.Name("g1"), testdb.Name("g2")
	_, err := run(t, ctx, "", "stream", "create", s, "--partitions", "2")
	require.NoError(t, err)
	_, err = run(t, ctx, "0\n1\n2\n", "produce", s, "-p", "0")
	require.NoError(t, err)
	_, err = run(t, ctx, "3\n4\n", "produce", s, "-p", "1")
	require.NoError(t, err)
	for _, g := range []string{g1, g2} {
		out, err := run(t, ctx, "", "consume", s, "-G", g, "-e")
		require.NoError(t, err, out)
	}

	out, err := run(t, ctx, "", "groups", "describe", "--all-groups", "--stream", s)
	require.NoError(t, err, out)
	for _, g := range []string{g1, g2} {
		require.Regexp(t, s+`\s+`+g+`\s+0\s+3\s+3\s+0\s`, out)
		require.Regexp(t, s+`\s+`+g+`\s+1\s+2\s+2\s+0\s`, out)
	}
	out, err = run(t, ctx, "", "-O", "json", "groups", "describe", "--all-groups", "--stream", s)
	require.NoError(t, err)
	var all []consumergroup.GroupDescription
	require.NoError(t, json.Unmarshal([]byte(out), &all), out)
	require.Len(t, all, 2)
	_, err = run(t, ctx, "", "groups", "describe", g1, "--all-groups")
	require.ErrorContains(t, err, "give no GROUP")

	out, err = run(t, ctx, "", "groups", "offsets", "export", g1)
	require.NoError(t, err)
	require.Equal(t, s+",0,3\n"+s+",1,2\n", out)
	dir := t.TempDir()
	saved := filepath.Join(dir, "saved.csv")
	require.NoError(t, os.WriteFile(saved, []byte(out), 0o600))
	rewind := filepath.Join(dir, "rewind.csv")
	require.NoError(t, os.WriteFile(rewind, []byte("stream,partition,offset\n"+s+",0,1\n"+s+", 1, 0\n"), 0o600))

	offsetsOf := func(g string) string {
		t.Helper()
		out, err := run(t, ctx, "", "groups", "offsets", "export", g, "--stream", s)
		require.NoError(t, err)
		return out
	}
	out, errOut, err := runSplit(t, ctx, "", "groups", "reset-offsets", g1, "--from-file", rewind)
	require.NoError(t, err, errOut)
	require.Contains(t, errOut, "preview only")
	require.Regexp(t, s+`\s+0\s+3\s+1`, out)
	require.Equal(t, s+",0,3\n"+s+",1,2\n", offsetsOf(g1), "a preview changes nothing")
	_, err = run(t, ctx, "", "groups", "reset-offsets", g1, "--from-file", rewind, "--execute")
	require.NoError(t, err)
	require.Equal(t, s+",0,1\n"+s+",1,0\n", offsetsOf(g1))
	_, err = run(t, ctx, "", "groups", "reset-offsets", g1, "--from-file", "-", "--execute", "--stream", s)
	require.ErrorContains(t, err, "no offsets", "an empty stdin")
	err = runTo(t, ctx, io.Discard, io.Discard, mustRead(t, saved), "groups", "reset-offsets", g1, "--from-file", "-", "--execute", "--stream", s)
	require.NoError(t, err)
	require.Equal(t, s+",0,3\n"+s+",1,2\n", offsetsOf(g1), "the export, read back")
	require.Equal(t, s+",0,3\n"+s+",1,2\n", offsetsOf(g2), "another group's offsets are not touched")

	bad := filepath.Join(dir, "bad.csv")
	for _, c := range []struct {
		file, want string
		args       []string
	}{
		{s + ",0,0\n" + s + ",9,0\n", "no partition 9", nil},
		{s + ",0,0\n" + s + ",0,1\n", "given twice", nil},
		{s + ",x,0\n", "line 1: partition \"x\"", nil},
		{s + ",0\n", "line 1: 2 fields", nil},
		{"other-group," + s + ",0,0\n", "is not", nil},
		{s + ",0,0\n", "--stream is other", []string{"--stream", "other"}},
		{s + ",0,0\n", "--from-file and --to-earliest", []string{"--to-earliest"}},
	} {
		require.NoError(t, os.WriteFile(bad, []byte(c.file), 0o600))
		_, err := run(t, ctx, "", append([]string{"groups", "reset-offsets", g1, "--from-file", bad, "--execute"}, c.args...)...)
		require.ErrorContains(t, err, c.want, c.file)
		require.Equal(t, s+",0,3\n"+s+",1,2\n", offsetsOf(g1), "nothing written: %s", c.file)
	}
	_, err = run(t, ctx, "", "groups", "offsets", "export", testdb.Name("none"))
	require.ErrorIs(t, err, consumergroup.ErrGroupNotFound)
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestCLIRedriveTaskProgress: dlq task watch (and task create --wait) follows a task
// until it finishes, with progress lines on stderr (log lines, not being a terminal),
// then prints it; a canceled task is an error.
func TestCLIRedriveTaskProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dlq := testdb.Name("watch")
	_, err := run(t, ctx, "", "queue", "create", dlq)
	require.NoError(t, err)
	c, err := messages.NewClient(testdb.Pool(t), nil)
	require.NoError(t, err)
	task, err := c.CreateRedriveTask(ctx, dlq, &messages.RedriveTaskOpts{MaxMessages: 5})
	require.NoError(t, err)
	id := strconv.FormatInt(task.ID, 10)

	var out, errOut lockedBuffer
	done := make(chan error, 1)
	go func() { // owner: the test; ends when the task does
		done <- runTo(t, ctx, &out, &errOut, "", "dlq", "task", "watch", dlq, id)
	}()
	testdb.WaitFor(t, 30*time.Second, "the first progress line", func() bool {
		return strings.Contains(errOut.String(), "status=pending")
	})
	_, open, err := c.StepRedriveTask(ctx, dlq, task.ID, 10) // nothing to move: done
	require.NoError(t, err)
	require.True(t, open)
	select {
	case err := <-done:
		require.NoError(t, err, errOut.String())
	case <-time.After(30 * time.Second):
		t.Fatal("dlq task watch did not end with its task")
	}
	require.Contains(t, errOut.String(), fmt.Sprintf(`msg="redrive task %s of %s"`, id, dlq))
	require.Contains(t, errOut.String(), "status=done")
	require.Regexp(t, dlq+`\s+`+id+`\s+done`, out.String())

	outS, errS, err := runSplit(t, ctx, "", "dlq", "task", "create", dlq, "--wait")
	require.NoError(t, err, errS)
	require.Contains(t, errS, "status=done", "an empty queue's task is done at once")
	require.Contains(t, outS, "done")

	task, err = c.CreateRedriveTask(ctx, dlq, &messages.RedriveTaskOpts{MaxMessages: 5})
	require.NoError(t, err)
	_, err = c.CancelRedriveTask(ctx, dlq, task.ID)
	require.NoError(t, err)
	_, err = run(t, ctx, "", "dlq", "task", "watch", dlq, strconv.FormatInt(task.ID, 10))
	require.ErrorContains(t, err, "was canceled")
	_, err = run(t, ctx, "", "dlq", "task", "watch", dlq, "999999999")
	require.ErrorIs(t, err, messages.ErrRedriveTaskNotFound)
}

// TestParseOffsetAndFormat: kcat's -o values and -f tokens, and the refusals that
// name what was wrong.
func TestParseOffsetAndFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]offsetSpec{
		"beginning":              {kind: offsetBeginning},
		"end":                    {kind: offsetEnd},
		"stored":                 {kind: offsetStored},
		"0":                      {kind: offsetAbsolute},
		"42":                     {kind: offsetAbsolute, n: 42},
		"-3":                     {kind: offsetFromEnd, n: 3},
		"@1795341600000":         {kind: offsetTime, t: time.UnixMilli(1795341600000)},
		"s@1795341600000":        {kind: offsetTime, t: time.UnixMilli(1795341600000)},
		"@2026-11-22T10:00:00Z":  {kind: offsetTime, t: at},
		"s@2026-11-22T10:00:00Z": {kind: offsetTime, t: at},
	} {
		got, err := parseOffset(in)
		require.NoError(t, err, in)
		require.Equal(t, want.kind, got.kind, in)
		require.Equal(t, want.n, got.n, in)
		require.True(t, want.t.Equal(got.t), "%s: %v", in, got.t)
	}
	for _, in := range []string{"", "begin", "1.5", "@", "@soon", "e@1", "--1"} {
		_, err := parseOffset(in)
		require.ErrorContains(t, err, "--offset", in)
	}

	ev := &streams.Event{Stream: "s", Partition: 2, Offset: 7, Key: "k", Data: []byte(`{"a": 1}`),
		Timestamp: time.UnixMilli(1234), Headers: map[string]string{"y": "2", "x": "1"}}
	for f, want := range map[string]string{
		`%t/%p@%o %k=%s\n`:   "s/2@7 k={\"a\": 1}\n",
		`%K %S %T %h`:        "1 8 1234 x=1,y=2",
		`100%% \t\\ \q`:      "100% \t\\ \\q",
		`plain`:              "plain",
		`%s|%S|%k|%K`:        `{"a": 1}|8|k|1`,
		`\r\n`:               "\r\n",
		`%p%o%p`:             "272",
		`%h,%k`:              "x=1,y=2,k",
		`kcat's %k and %s\n`: "kcat's k and {\"a\": 1}\n",
	} {
		pieces, err := parseFormat(f)
		require.NoError(t, err, f)
		require.Equal(t, want, string(appendFormatted(nil, pieces, ev)), f)
	}
	raw := &streams.Event{Bytes: []byte("hi"), RawHeaders: []streams.Header{{Key: "b", Value: []byte("1")}, {Key: "a", Value: []byte("2")}}}
	pieces, err := parseFormat(`%s %S %K [%k] %h`)
	require.NoError(t, err)
	require.Equal(t, "hi 2 -1 [] b=1,a=2", string(appendFormatted(nil, pieces, raw)), "bytes as is; no key; raw headers in order")
	for _, f := range []string{"%", "abc%", "%x", "%d"} {
		_, err := parseFormat(f)
		require.ErrorContains(t, err, "--format", f)
	}
}
