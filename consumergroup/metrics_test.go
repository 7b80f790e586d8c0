package consumergroup

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// counterValue sums a counter vector over all label values.
func counterValue(v *prometheus.CounterVec) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { v.Collect(ch); close(ch) }()
	total := 0.0
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		total += d.GetCounter().GetValue()
	}
	return total
}
