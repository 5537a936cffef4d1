package rss

import (
	"runtime"
	"testing"
	"time"
)

// parseStat reads /proc/stat's all-cores line in ns (ticks of 10 ms): in
// all, idle with I/O wait, stolen; it refuses other lines and shapes.
func TestParseStat(t *testing.T) {
	const stat = "cpu  9294567 0 922796 5223615 14064 0 58856 36447 0 0\ncpu0 4646348 0 454005 2624781 3561 0 28233 18167 0 0\n"
	u, ok := parseStat([]byte(stat))
	if !ok {
		t.Fatal("parseStat refused /proc/stat's shape")
	}
	const tick = 1e9 / userHz
	want := HostUsage{
		TotalNs: (9294567 + 922796 + 5223615 + 14064 + 58856 + 36447) * tick,
		IdleNs:  (5223615 + 14064) * tick,
		StealNs: 36447 * tick,
	}
	if u != want {
		t.Fatalf("parseStat = %+v, want %+v", u, want)
	}
	d := u.Minus(HostUsage{TotalNs: want.TotalNs - 1000, IdleNs: want.IdleNs - 250, StealNs: want.StealNs - 100})
	if d.StealFraction() != 0.1 || d.IdleFraction() != 0.25 {
		t.Fatalf("fractions of %+v: steal %v, idle %v; want 0.1, 0.25", d, d.StealFraction(), d.IdleFraction())
	}
	if f := d.OtherFraction(Usage{CPUNs: 450}); f != 0.2 {
		t.Fatalf("%+v with 450 ns of this process's CPU: other processes' share %v, want 0.2", d, f)
	}
	if f := d.OtherFraction(Usage{CPUNs: 700}); f != 0 {
		t.Fatalf("%+v with more CPU of this process's than was busy: other processes' share %v, want 0", d, f)
	}
	if (HostUsage{}).StealFraction() != 0 {
		t.Fatal("a fraction of no time is not 0")
	}
	for _, bad := range []string{
		"", "intr 1 2 3 4 5 6 7 8 9\n", "cpu 1 2 3 4 5 6 7\n", "cpu 1 2 3 x 5 6 7 8\n", "cpu 1 2 3 -4 5 6 7 8\n", "cpu0 1 2 3 4 5 6 7 8\n",
	} {
		if u, ok := parseStat([]byte(bad)); ok {
			t.Errorf("parseStat(%q) = %+v, want refused", bad, u)
		}
	}
}

// The machine's CPU time grows while this process spins (Linux).
func TestHost(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	u0 := Host()
	if u0.TotalNs <= 0 || u0.IdleNs < 0 || u0.StealNs < 0 || u0.IdleNs+u0.StealNs > u0.TotalNs {
		t.Fatalf("Host() = %+v", u0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for Host().TotalNs == u0.TotalNs {
		if time.Now().After(deadline) {
			t.Fatal("the machine's CPU time did not grow in 10 s of spinning")
		}
		for range 1 << 20 {
			runtime.Gosched()
		}
	}
}
