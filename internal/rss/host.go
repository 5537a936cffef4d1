package rss

import (
	"bytes"
	"os"
	"strconv"
)

// HostUsage is the machine's CPU time over all its cores, in ns: in all,
// idle (idle and waiting for I/O), and stolen (a virtual machine's vCPUs
// waiting for the hypervisor's cores: time the guest wanted to run and
// could not; Linux charges it to no task, so a process's CPU time leaves
// it out while its wall time includes it).
type HostUsage struct {
	TotalNs, IdleNs, StealNs int64
}

// Minus returns the machine's usage since v.
func (u HostUsage) Minus(v HostUsage) HostUsage {
	return HostUsage{TotalNs: u.TotalNs - v.TotalNs, IdleNs: u.IdleNs - v.IdleNs, StealNs: u.StealNs - v.StealNs}
}

// StealFraction is the stolen share of the machine's CPU time (0 if none
// was counted).
func (u HostUsage) StealFraction() float64 { return fraction(u.StealNs, u.TotalNs) }

// IdleFraction is the idle share of the machine's CPU time (0 if none was
// counted).
func (u HostUsage) IdleFraction() float64 { return fraction(u.IdleNs, u.TotalNs) }

// OtherFraction is the share of the machine's CPU time that other
// processes (and the kernel's own threads) used while this process used
// own: neither idle, nor stolen, nor this process's. It is 0 where the
// clock tick's coarser count leaves less than own.
func (u HostUsage) OtherFraction(own Usage) float64 {
	return fraction(max(u.TotalNs-u.IdleNs-u.StealNs-own.CPUNs, 0), u.TotalNs)
}

func fraction(x, of int64) float64 {
	if of <= 0 {
		return 0
	}
	return float64(x) / float64(of)
}

// Host returns the machine's CPU time so far, from /proc/stat; zero where
// it cannot be read (not Linux). Its resolution is the kernel's clock
// tick for user space, 10 ms a core.
func Host() HostUsage {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return HostUsage{}
	}
	u, _ := parseStat(b)
	return u
}

// userHz is the unit of /proc/stat's times: USER_HZ, 100 on every Linux
// architecture Go supports.
const userHz = 100

// parseStat reads the all-cores "cpu" line of /proc/stat: user, nice,
// system, idle, iowait, irq, softirq and steal times (the guest times
// after them are counted in user and nice already).
func parseStat(b []byte) (HostUsage, bool) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return HostUsage{}, false
	}
	var t [8]int64
	for i := range t {
		v, err := strconv.ParseInt(string(f[1+i]), 10, 64)
		if err != nil || v < 0 {
			return HostUsage{}, false
		}
		t[i] = v * (1e9 / userHz)
	}
	var u HostUsage
	for _, v := range t {
		u.TotalNs += v
	}
	u.IdleNs, u.StealNs = t[3]+t[4], t[7]
	return u, true
}
