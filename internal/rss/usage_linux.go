package rss

import "syscall"

// Process returns what the process has used so far: CPU time (user and
// system) and system CPU time in ns, and page faults; zero if it cannot
// be read.
func Process() Usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return Usage{}
	}
	return Usage{CPUNs: ru.Utime.Nano() + ru.Stime.Nano(), SysNs: ru.Stime.Nano(), Faults: ru.Minflt + ru.Majflt}
}
