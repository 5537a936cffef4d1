package serve

import (
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// LintMetrics runs the Prometheus library's metric lint over the
// service's registry.
func LintMetrics(s *Service) ([]promlint.Problem, error) {
	return testutil.GatherAndLint(s.metrics.registry)
}

// IndexForTest creates (or returns) the index of a model for the default
// tenant, to fill directly in benchmarks.
func IndexForTest(s *Service, model string, blockSize int) interface {
	ApplyEvent(kvevent.RouterEvent) error
	Flush() (int, error)
} {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	k := modelKey{model, DefaultTenant}
	if s.indexes[k] == nil {
		s.indexes[k] = indexOver(s.cfg.pools().newPool(blockSize), blockSize, s.cfg.PredictTTL)
	}
	return s.indexes[k].pool
}

// PendingForTest returns how many instances are reserved, their endpoints
// being dialled.
func PendingForTest(s *Service) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}
