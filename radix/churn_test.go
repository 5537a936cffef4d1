package radix_test

import (
	"testing"

	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

// TestChurn: every index gives back what departed workers held.
func TestChurn(t *testing.T) {
	for name, idx := range map[string]radix.Index{
		"tree":       radix.NewTree(),
		"concurrent": radix.NewConcurrentTree(),
		"compressed": radix.NewCompressedTree(),
	} {
		t.Run(name, func(t *testing.T) { radixtest.Churn(t, idx, 512<<10) })
	}
}
