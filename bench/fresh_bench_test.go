package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvradix/kvradix/internal/rss"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// BenchmarkFreshStore is BenchmarkParallelStore with every figure from a
// process of its own (this test binary, run again as TestFreshStoreChild):
// the whole trace-shaped workload stored into an empty CompressedTree by
// writers=1 or 2 writers, each storing the requests of the workers w with
// w mod writers = its number, at the same GOMAXPROCS (2) either way, so
// that one writer and two differ only in the writers. events=go stores the
// events as the workload builds them; events=json stores them decoded from
// their JSON, one allocation pattern of a real ingest. Each iteration is
// one process; ns/block is the store's wall time per stored block (the
// workload's building is not timed), cpu-ns/block the process's CPU over
// the store per block (above ns/block where one writer's tree has work
// done on the other core: results/fresh-store-cpu.txt), sys-ns/block the
// system CPU of it and faults/block its page faults (on a virtual machine
// faulting in the memory the index grows into is most of the system time),
// rss-MB the child's peak RSS, build-ms the time to make the empty tree,
// host-idle-%, host-steal-% and host-other-% the machine's CPU time over
// the store that was idle, stolen by the hypervisor or used by other
// processes: where two writers run little faster than one, a core was
// idle (a writer waited), taken from the virtual machine (its wall time
// counts, its CPU time does not) or busy with another process.
func BenchmarkFreshStore(b *testing.B) {
	for _, events := range []string{"go", "json"} {
		for _, writers := range []int{1, 2} {
			b.Run(fmt.Sprintf("events=%s/writers=%d", events, writers), func(b *testing.B) { freshStores(b, events, writers, "grown") })
		}
	}
}

// BenchmarkFreshStoreSized is BenchmarkFreshStore's events=go over a tree
// whose table of engine hashes is sized up front for the blocks stored
// (radix.NewCompressedTreeSized: the stored pairs, an upper bound of the
// distinct blocks, as the engines' pools summed would be).
func BenchmarkFreshStoreSized(b *testing.B) {
	for _, writers := range []int{1, 2} {
		b.Run(fmt.Sprintf("events=go/writers=%d", writers), func(b *testing.B) { freshStores(b, "go", writers, "sized") })
	}
}

// freshFigures are what a child measured.
type freshFigures struct {
	nsPerBlock, cpuPerBlock, sysPerBlock, faultsPerBlock, rssMB, buildMs, idlePct, stealPct, otherPct float64
}

// freshFormat is how a child prints its figures.
const freshFormat = "fresh-store ns/block=%g cpu-ns/block=%g sys-ns/block=%g faults/block=%g rss-MB=%g build-ms=%g host-idle-%%=%g host-steal-%%=%g host-other-%%=%g"

// freshStores runs a child per iteration and reports their means, and
// their greatest peak RSS.
func freshStores(b *testing.B, events string, writers int, table string) {
	var sum freshFigures
	runs := 0
	for b.Loop() {
		f := freshStore(b, events, writers, table)
		sum.nsPerBlock += f.nsPerBlock
		sum.cpuPerBlock += f.cpuPerBlock
		sum.sysPerBlock += f.sysPerBlock
		sum.faultsPerBlock += f.faultsPerBlock
		sum.buildMs += f.buildMs
		sum.idlePct += f.idlePct
		sum.stealPct += f.stealPct
		sum.otherPct += f.otherPct
		sum.rssMB = max(sum.rssMB, f.rssMB)
		runs++
	}
	n := float64(runs)
	b.ReportMetric(sum.nsPerBlock/n, "ns/block")
	b.ReportMetric(sum.cpuPerBlock/n, "cpu-ns/block")
	b.ReportMetric(sum.sysPerBlock/n, "sys-ns/block")
	b.ReportMetric(sum.faultsPerBlock/n, "faults/block")
	b.ReportMetric(sum.rssMB, "rss-MB")
	b.ReportMetric(sum.buildMs/n, "build-ms")
	b.ReportMetric(sum.idlePct/n, "host-idle-%")
	b.ReportMetric(sum.stealPct/n, "host-steal-%")
	b.ReportMetric(sum.otherPct/n, "host-other-%")
}

// freshStore runs one child and returns its figures.
func freshStore(b *testing.B, events string, writers int, table string) freshFigures {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFreshStoreChild$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "KVRADIX_FRESH_STORE="+events+","+strconv.Itoa(writers)+","+table, "GOMAXPROCS=2")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b.Fatalf("child: %v\n%s", err, out.String())
	}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var f freshFigures
		if _, err := fmt.Sscanf(sc.Text(), freshFormat, &f.nsPerBlock, &f.cpuPerBlock, &f.sysPerBlock, &f.faultsPerBlock, &f.rssMB, &f.buildMs, &f.idlePct, &f.stealPct, &f.otherPct); err == nil {
			return f
		}
	}
	b.Fatalf("child said no figure:\n%s", out.String())
	return freshFigures{}
}

// TestFreshStoreChild is BenchmarkFreshStore's child; it does nothing
// unless run by it.
func TestFreshStoreChild(t *testing.T) {
	spec := os.Getenv("KVRADIX_FRESH_STORE")
	if spec == "" {
		t.Skip("run by BenchmarkFreshStore")
	}
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		t.Fatalf("KVRADIX_FRESH_STORE=%q, want events,writers,table", spec)
	}
	events, table := parts[0], parts[2]
	writers, err := strconv.Atoi(parts[1])
	if err != nil || writers < 1 {
		t.Fatalf("KVRADIX_FRESH_STORE=%q", spec)
	}
	reqs, blocks := shapedWorkload(t)
	evs := make([]kvevent.RouterEvent, len(reqs))
	for i := range reqs {
		evs[i] = reqs[i].store
		if events == "json" {
			js, _ := evs[i].MarshalJSON()
			evs[i] = kvevent.RouterEvent{}
			if err := evs[i].UnmarshalJSON(js); err != nil {
				t.Fatal(err)
			}
		}
	}
	runtime.GC()
	built := time.Now()
	idx := radix.NewCompressedTree()
	if table == "sized" {
		idx = radix.NewCompressedTreeSized(blocks)
	}
	use0, host0 := rss.Process(), rss.Host()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range evs {
				if int(evs[i].WorkerID)%writers == g {
					if err := idx.Apply(evs[i]); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	use, host := rss.Process().Minus(use0), rss.Host().Minus(host0)
	perBlock := func(x int64) float64 { return float64(x) / float64(blocks) }
	fmt.Printf(freshFormat+"\n", perBlock(elapsed.Nanoseconds()), perBlock(use.CPUNs), perBlock(use.SysNs), perBlock(use.Faults),
		float64(rss.Peak())/(1<<20), float64(start.Sub(built).Microseconds())/1e3, 100*host.IdleFraction(), 100*host.StealFraction(), 100*host.OtherFraction(use))
}
