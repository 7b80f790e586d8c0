package forward_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/forward"
)

// Bad configuration is refused by New with an error naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:1/"
	cases := map[string]forward.Config{
		"Config.AMQPURL":        {Stream: "s", Queue: "q"},
		"Config.Stream":         {AMQPURL: url, Queue: "q"},
		"Config.Queue":          {AMQPURL: url, Stream: "s"},
		"Config.MaxBatchSize":   {AMQPURL: url, Stream: "s", Queue: "q", MaxBatchSize: -1},
		"Config.ConfirmTimeout": {AMQPURL: url, Stream: "s", Queue: "q", ConfirmTimeout: -1},
	}
	for field, cfg := range cases {
		_, err := forward.New(nil, &cfg)
		require.ErrorContains(t, err, field)
	}
	_, err := forward.New(nil, &forward.Config{AMQPURL: "http://x", Stream: "s", Queue: "q"})
	require.ErrorContains(t, err, "Config.AMQPURL")
	_, err = forward.New(nil, &forward.Config{AMQPURL: url, Stream: "s", Queue: "q"})
	require.NoError(t, err)
	_, err = forward.New(nil, nil)
	require.ErrorContains(t, err, "Config.AMQPURL", "a nil Config is an empty one")
}
