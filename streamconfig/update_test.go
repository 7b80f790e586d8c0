package streamconfig_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// Concurrent Updates of one stream apply one after the other: every reader added is
// kept. An error from fn writes nothing; an invalid result is ErrInvalidConfig and
// writes nothing; an unknown stream is ErrStreamNotFound.
func TestUpdateLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _, name := setup(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- store.Update(ctx, name, func(c *streamconfig.Config) error {
				if c.AccessControl == nil {
					c.AccessControl = &streamconfig.AccessControl{}
				}
				c.AccessControl.Readers = append(c.AccessControl.Readers, fmt.Sprintf("reader-%d", i))
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	cfg, err := store.Get(ctx, name)
	require.NoError(t, err)
	require.Len(t, cfg.AccessControl.Readers, n)

	boom := errors.New("boom")
	require.ErrorIs(t, store.Update(ctx, name, func(c *streamconfig.Config) error {
		c.AccessControl = nil
		return boom
	}), boom)
	err = store.Update(ctx, name, func(c *streamconfig.Config) error {
		c.AccessControl.Readers = append(c.AccessControl.Readers, "bad\x00name")
		return nil
	})
	require.ErrorIs(t, err, streamconfig.ErrInvalidConfig)
	cfg, err = store.Get(ctx, name)
	require.NoError(t, err)
	require.Len(t, cfg.AccessControl.Readers, n, "nothing written")

	require.ErrorIs(t, store.Update(ctx, "no-such-stream-update", func(*streamconfig.Config) error { return nil }), streams.ErrStreamNotFound)
}
