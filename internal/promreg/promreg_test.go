package promreg_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/promreg"
)

func TestSecondRegistrationShares(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	a, b := prometheus.NewCounter(opts), prometheus.NewCounter(opts)
	require.NoError(t, promreg.Register(reg, &a))
	require.NoError(t, promreg.Register(reg, &b))
	require.Same(t, a, b, "the second registration shares the first collector")

	c := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "x"})
	require.Error(t, promreg.Register(reg, &c), "another type under the name is refused")
	d := prometheus.NewCounter(prometheus.CounterOpts{Name: "x_total", Help: "other help"})
	require.Error(t, promreg.Register(reg, &d))

	e := prometheus.NewCounter(opts)
	require.NoError(t, promreg.Register(nil, &e), "a nil registry registers nothing")
}
