package retention_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streams"
)

// TestRunOnceOpts: RunOnce with opts.Streams applies exactly those streams in order,
// enabled or not, reports each through Report (a missing stream as its error, the
// others still run), and with DryRun deletes nothing and reports what it would.
func TestRunOnceOpts(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	f.produce(0, 10)
	f.policy("max_event_count = 4, enabled = false")
	missing := "no-such-" + f.stream

	type report struct {
		stream string
		res    *retention.StreamResult
		err    error
	}
	var reports []report
	collect := func(stream string, res *retention.StreamResult, err error) {
		reports = append(reports, report{stream, res, err})
	}
	results, err := f.runner.RunOnce(f.ctx, &retention.RunOnceOpts{DryRun: true, Streams: []string{missing, f.stream}, Report: collect})
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	require.Len(t, reports, 2)
	require.Equal(t, missing, reports[0].stream)
	require.Error(t, reports[0].err)
	require.Equal(t, f.stream, reports[1].stream)
	require.NoError(t, reports[1].err)
	require.True(t, reports[1].res.DryRun)
	require.EqualValues(t, 6, reports[1].res.Deleted(), "would delete")
	require.Len(t, results, 1)
	require.Len(t, f.stored(0), 10, "a dry run deletes nothing")

	reports = nil
	results, err = f.runner.RunOnce(f.ctx, &retention.RunOnceOpts{Streams: []string{f.stream}, Report: collect})
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.EqualValues(t, 6, results[0].Deleted(), "a disabled policy named explicitly is applied")
	require.Len(t, f.stored(0), 4)

	results, err = f.runner.RunOnce(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, results, "without opts.Streams, only enabled policies")
}
