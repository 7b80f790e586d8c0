package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNextDoublesUpToMaxAndResets(t *testing.T) {
	t.Parallel()
	b := New(10*time.Millisecond, 50*time.Millisecond)
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond,
		50 * time.Millisecond, 50 * time.Millisecond}, got)
	b.Reset()
	require.Equal(t, 10*time.Millisecond, b.Next())
	require.Equal(t, 20*time.Millisecond, b.Peek())
}

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	t.Parallel()
	b := NewJittered(100*time.Millisecond, 400*time.Millisecond)
	for i, step := range []time.Duration{100, 200, 400, 400} {
		step *= time.Millisecond
		d := b.Next()
		require.GreaterOrEqual(t, d, step/2, "wait %d", i)
		require.LessOrEqual(t, d, step, "wait %d", i)
	}
}

func TestMaxBelowMinIsMin(t *testing.T) {
	t.Parallel()
	b := New(30*time.Millisecond, time.Millisecond)
	require.Equal(t, 30*time.Millisecond, b.Next())
	require.Equal(t, 30*time.Millisecond, b.Next())
}

func TestSleepEndsWithCtx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, Sleep(ctx, time.Hour))
	require.False(t, New(time.Hour, time.Hour).Wait(ctx))
	require.True(t, Sleep(context.Background(), time.Microsecond))
}
