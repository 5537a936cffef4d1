package rss

// Usage is what a process used: CPU time (user and system) and system CPU
// time in ns, and page faults. On a virtual machine most system time of a
// growing index is page faults: faulting in the memory it grows into.
type Usage struct {
	CPUNs, SysNs, Faults int64
}

// Minus returns what u used since v.
func (u Usage) Minus(v Usage) Usage {
	return Usage{CPUNs: u.CPUNs - v.CPUNs, SysNs: u.SysNs - v.SysNs, Faults: u.Faults - v.Faults}
}
