package router_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
)

// A zero Scheduler answers every call with an error or nothing, never a
// panic (Schedule used to index its empty tables).
func TestZeroScheduler(t *testing.T) {
	var s router.Scheduler
	req := router.SchedRequest{ID: uuid.New(), ISL: 64, Blocks: []uint64{1, 2, 3, 4}}
	if _, err := s.Schedule(context.Background(), req); err == nil {
		t.Fatal("a zero Scheduler scheduled a request")
	}
	if err := s.Admit(req, kvevent.Worker{}); err == nil {
		t.Fatal("a zero Scheduler admitted a request")
	}
	if s.Free(req.ID) == nil || s.MarkPrefillCompleted(req.ID) == nil {
		t.Fatal("a zero Scheduler freed an unknown request")
	}
	if loads := s.PotentialLoads(req); len(loads) != 0 {
		t.Fatalf("a zero Scheduler reports %d workers' loads", len(loads))
	}
}
