package serve

import (
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// LintMetrics runs the Prometheus library's metric lint over the
// service's registry.
func LintMetrics(s *Service) ([]promlint.Problem, error) {
	return testutil.GatherAndLint(s.metrics.registry)
}
