package main

import (
	"encoding/json"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kvradix/kvradix/openloop"
)

// -repeat runs fresh processes and reports each indexer's medians, their
// intervals and spreads, per lane CPU-second among them.
func TestIndexerRepeat(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"indexer", "-json", "-repeat", "2", "-compare", "compressed", "-duration", "200ms"}, indexerSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep repeatReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.Repeat != 2 || len(rep.Runs) != 2 || len(rep.Summary) != 1 || rep.Summary[0].Runs != 2 || rep.Summary[0].Impl != "compressed" {
		t.Fatalf("%+v", rep)
	}
	if len(rep.Runs[0]) != 1 || rep.Runs[0][0].Index != "compressed" {
		t.Fatalf("%+v", rep.Runs[0])
	}
	spreads := []spread{rep.Summary[0].AchievedBlockOpS}
	if runtime.GOOS == "linux" { // where the lanes' CPU is read
		spreads = append(spreads, rep.Summary[0].PerLaneCPU)
	}
	for _, s := range spreads {
		if !(s.Min <= s.CI95[0] && s.CI95[0] <= s.Median && s.Median <= s.CI95[1] && s.CI95[1] <= s.Max && s.Min > 0) || !strings.Contains(rep.Command, "-repeat 2") {
			t.Fatalf("%+v in %+v", s, rep)
		}
	}
	if _, _, err := runArgs(t, "indexer", "-repeat", "0"); err == nil {
		t.Fatal("-repeat 0 accepted")
	}
}

// -sustained searches the threshold in fresh processes: every point
// reported, the window halving until one fails and then bisected, the
// sustained rate a passing point's offered rate, with its figure per
// second of the index's CPU; -trials then runs that many more at the
// sustained point, in the arms A and A' (the flag not passed on to them).
func TestSustained(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"indexer", "-json", "-sustained", "-trials=2", "-compare", "compressed", "-duration", "400ms"}, indexerSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep openloop.Sustained
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Points) < 2 {
		t.Fatalf("%d points", len(rep.Points))
	}
	best := 0.0
	for _, p := range rep.Points {
		if p.Passed {
			if len(p.AchievedBlockOpsPerSec) != openloop.SustainedRuns {
				t.Fatalf("a passing point of %d processes", len(p.AchievedBlockOpsPerSec))
			}
			best = max(best, p.OfferedBlockOpsPerSec)
		}
	}
	linux := runtime.GOOS == "linux" // where the lanes' CPU is read
	if rep.BlockOpsPerSec != best || (best > 0 && linux && rep.PerLaneCPU <= 0) {
		t.Fatalf("sustained %v (per lane CPU %v), best passing point %v", rep.BlockOpsPerSec, rep.PerLaneCPU, best)
	}
	if best == 0 {
		if rep.Trials != nil {
			t.Fatalf("trials without a sustained point: %+v", rep.Trials)
		}
		return
	}
	tr := rep.Trials
	if tr == nil || len(tr.Runs) != 2 || tr.Runs[0].Arm != "A" || tr.Runs[1].Arm != "A'" || tr.OfferedBlockOpsPerSec != best {
		t.Fatalf("trials %+v", tr)
	}
	for _, r := range tr.Runs {
		if r.AchievedBlockOpsPerSec <= 0 || linux && r.BlockOpsPerLaneCPU <= 0 {
			t.Fatalf("trial %+v", r)
		}
	}
	if e := tr.AAPerLaneCPURatio; linux && !(e.Median > 0 && e.CI95[0] <= e.Median && e.Median <= e.CI95[1]) {
		t.Fatalf("A/A ratio %+v", e)
	}
}

// A search whose processes fail is an error, its report written all the
// same (here with no point: each process refuses the missing corpus).
func TestSustainedFailing(t *testing.T) {
	out, _, err := runArgs(t, "indexer", "-json", "-sustained", "-trials=2", "-quiet", "-corpus", filepath.Join(t.TempDir(), "missing.smg"))
	if err == nil {
		t.Fatal("a search whose processes fail succeeded")
	}
	var rep openloop.Sustained
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil || rep.Command == "" || len(rep.Points) != 0 || rep.Trials != nil {
		t.Fatalf("report %q (%v) after %v", out, jerr, err)
	}
}

// A search's fresh processes get its flags but -sustained and -trials,
// however they were written.
func TestChildArgs(t *testing.T) {
	for _, c := range []struct{ args, want []string }{
		{[]string{"-sustained", "-trials", "20", "-compare=compressed", "--duration", "2s", "-json"}, []string{"-compare=compressed", "--duration", "2s", "-json"}},
		{[]string{"--trials=3", "-lanes", "1", "--sustained=true", "-sized"}, []string{"-lanes", "1", "-sized"}},
	} {
		if got := childArgs(c.args); !slices.Equal(got, c.want) {
			t.Fatalf("childArgs(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}
