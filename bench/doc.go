// Package bench is kvradix's cross-package benchmark suite: one benchmark
// body per workload, run against every implementation (impl=tree,
// impl=concurrent for indexes; impl=single, impl=pool/lanes=N for indexers).
// Names are key=value parts so that benchstat can slice them
// (benchstat -col /impl). The package has no non-test code.
package bench
