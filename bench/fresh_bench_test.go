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
// workload's building is not timed), rss-MB the child's peak RSS.
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

// freshStores runs a child per iteration and reports their mean ns per
// block and greatest peak RSS.
func freshStores(b *testing.B, events string, writers int, table string) {
	var nsPerBlock, rss float64
	runs := 0
	for b.Loop() {
		ns, mb := freshStore(b, events, writers, table)
		nsPerBlock += ns
		rss = max(rss, mb)
		runs++
	}
	b.ReportMetric(nsPerBlock/float64(runs), "ns/block")
	b.ReportMetric(rss, "rss-MB")
}

// freshStore runs one child and returns its ns per block and peak RSS.
func freshStore(b *testing.B, events string, writers int, table string) (float64, float64) {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFreshStoreChild$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "KVRADIX_FRESH_STORE="+events+","+strconv.Itoa(writers)+","+table, "GOMAXPROCS=2")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b.Fatalf("child: %v\n%s", err, out.String())
	}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var ns, mb float64
		if _, err := fmt.Sscanf(sc.Text(), "fresh-store ns/block=%g rss-MB=%g", &ns, &mb); err == nil {
			return ns, mb
		}
	}
	b.Fatalf("child said no figure:\n%s", out.String())
	return 0, 0
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
	idx := radix.NewCompressedTree()
	if table == "sized" {
		idx = radix.NewCompressedTreeSized(blocks)
	}
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
	fmt.Printf("fresh-store ns/block=%g rss-MB=%g\n", float64(elapsed.Nanoseconds())/float64(blocks), float64(rss.Peak())/(1<<20))
}
