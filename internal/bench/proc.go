package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every mainstream Linux build.
const clockTicks = 100

// procStat is what the bench reads from /proc/<pid>/stat.
type procStat struct {
	pid, ppid int
	// cpu is utime+stime, ms; children is cutime+cstime, ms (the CPU of
	// children the process has waited for).
	cpu, children float64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, fmt.Errorf("bench: cpu of pid %d: %w", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("bench: /proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("bench: /proc/%d/stat: %d fields", pid, len(f))
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v }
	ppid, _ := strconv.Atoi(f[1])
	ms := 1000.0 / clockTicks
	return procStat{pid: pid, ppid: ppid, cpu: (num(11) + num(12)) * ms, children: (num(13) + num(14)) * ms}, nil
}

// allStats reads every process's stat (those that vanish meanwhile are
// skipped).
func allStats() []procStat {
	ents, _ := os.ReadDir("/proc")
	var out []procStat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(pid); err == nil {
			out = append(out, st)
		}
	}
	return out
}

func cmdline(pid int) []string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// cpuSample is the CPU used so far, ms, by each measured process group.
type cpuSample struct {
	at   time.Time
	ms   map[string]float64
	pids map[string]int // service processes' pids, to notice restarts
}

// cpuMeter samples the CPU of the bench itself, the stack process (the
// embedded NATS server and the supervisor), each service it started, and
// PostgreSQL (the postmaster, the children it reaped, and its live children).
type cpuMeter struct {
	stackPid, postmasterPid int
}

// Process names in the CPU table, in print order after the services.
const (
	procNATS     = "nats+supervisor"
	procPostgres = "postgresql"
	procBench    = "bench (load, baselines)"
)

func (m cpuMeter) sample() cpuSample {
	s := cpuSample{at: time.Now(), ms: map[string]float64{}, pids: map[string]int{}}
	for _, st := range allStats() {
		switch {
		case st.pid == os.Getpid():
			s.ms[procBench] = st.cpu
		case m.stackPid != 0 && st.pid == m.stackPid:
			s.ms[procNATS] = st.cpu
		case m.stackPid != 0 && st.ppid == m.stackPid:
			if args := cmdline(st.pid); len(args) >= 3 && args[1] == "serve" {
				s.ms[args[2]] += st.cpu
				s.pids[args[2]] = st.pid
			}
		case m.postmasterPid != 0 && st.pid == m.postmasterPid:
			s.ms[procPostgres] += st.cpu + st.children
		case m.postmasterPid != 0 && st.ppid == m.postmasterPid:
			s.ms[procPostgres] += st.cpu
		}
	}
	return s
}

// postmasterPid reads the first line of <data>/postmaster.pid.
func postmasterPid(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("bench: postmaster pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("bench: postmaster pid: %w", err)
	}
	return pid, nil
}

func machineInfo() Machine {
	m := Machine{CPUs: numCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				m.MemoryGB = round(kb/1024/1024, 1)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.LoadAvg = loadAvg()
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
