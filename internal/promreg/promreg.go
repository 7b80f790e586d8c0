// Package promreg is the one way streamd's packages register their Prometheus
// collectors, so that a second registration behaves the same everywhere: two
// Producers, Clients, Consumers or Runners on one registry share the collectors
// (their counts add up), and nothing panics.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers *c on reg. When an equal collector (same name, help and labels)
// is already registered, *c becomes that one, so the second user shares it. A nil reg
// registers nothing (the collector still counts, unscraped: cheaper than nil checks).
// It fails when reg refuses *c for another reason (a collector of that name with other
// help or labels, or of another type).
func Register[C prometheus.Collector](reg prometheus.Registerer, c *C) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(*c)
	if err == nil {
		return nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			*c = existing
			return nil
		}
	}
	return fmt.Errorf("register metrics: %w", err)
}
