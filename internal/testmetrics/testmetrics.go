// Package testmetrics reads metric values out of a Prometheus registry, for tests.
package testmetrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Lookup returns the sum of the counter and gauge values of metric name's series whose
// labels include every name/value pair of labels (all its series when labels is
// empty), and whether there was any such series.
func Lookup(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("testmetrics: labels %q are not name/value pairs", labels)
	}
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("testmetrics: gather: %v", err)
	}
	sum, found := 0.0, false
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				matched := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						matched = true
					}
				}
				if !matched {
					continue series
				}
			}
			found = true
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum, found
}

// Value is Lookup of a series that must exist: the test fails when it does not.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := Lookup(t, g, name, labels...)
	if !ok {
		t.Fatalf("testmetrics: no series %s{%s}", name, strings.Join(labels, " "))
	}
	return v
}
