package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/internal/stack"
)

// How long a partition lasts: drawn uniformly between these, so that
// about half of them outlast the takeover bound of the default call
// timeout (3 s + 2 s + 1 s, saga.Liveness.TakeoverAfter) and a peer takes
// the cut replica's leases, and the others end while the replica is only
// fenced (after 3 s, saga.FenceAfter) or not even that.
const (
	PartitionMin = 2 * time.Second
	PartitionMax = 12 * time.Second
)

// partitioner is the part of a [System] that can cut one service
// replica's network (*stack.Stack started with Config.Partitions).
type partitioner interface {
	// Partitionable names the replicas that can be cut.
	Partitionable() []string
	// Cut breaks a replica's network in a shape of stack.CutShapes until
	// Heal.
	Cut(instance, shape string) error
	Heal(instance string) error
	// LogPath is an instance's log, where the audit counts fences and
	// leases taken over.
	LogPath(instance string) string
}

// PartitionStats is what the partitions of a run did.
type PartitionStats struct {
	// Shapes counts the partitions made per shape (stack.CutShapes).
	Shapes map[string]int `json:"shapes"`
	// Fenced counts the partitions whose replica fenced itself (its log
	// said no beat was confirmed by PostgreSQL for the fence bound).
	Fenced int `json:"fenced"`
	// LeasesMoved counts the leases of a cut replica that a peer took
	// over while it was cut ("took over a lease of a dead process" in the
	// peers' logs, naming the cut replica's process id).
	LeasesMoved int `json:"leases_moved"`
	// LongestMS is the longest partition, in milliseconds.
	LongestMS int64 `json:"longest_ms"`
}

// ParseDisruptionsOn is [ParseDisruptions] for a system of replicas
// processes of every service: the partition kind needs 2 or more (a peer
// must be there to take the cut replica's work) and is refused with
// fewer, naming it; "all" leaves it out then.
func ParseDisruptionsOn(s string, natsCluster, replicas int) ([]string, error) {
	kinds, err := ParseDisruptions(s, natsCluster)
	if err != nil || replicas >= 2 || !slices.Contains(kinds, DisruptPartition) {
		return kinds, err
	}
	for _, k := range strings.Split(s, ",") {
		if strings.TrimSpace(k) == DisruptPartition {
			return nil, fmt.Errorf("--faults: %s needs --replicas 2 or more (a peer takes over the cut replica's work)", DisruptPartition)
		}
	}
	return slices.DeleteFunc(kinds, func(k string) bool { return k == DisruptPartition }), nil
}

var (
	fenceLine    = regexp.MustCompile(`no beat confirmed by PostgreSQL[^\n]*process_id=(\d+)`)
	takeoverLine = regexp.MustCompile(`took over a lease of a dead process[^\n]*dead_process_id=(\d+)`)
)

// partition cuts a random service replica's network in a random shape
// for a random [PartitionMin]..[PartitionMax], heals it, waits until it is
// ready, and counts what happened meanwhile into r.parts.
func (r *run) partition(ctx context.Context) (string, error) {
	p, ok := r.sys.(partitioner)
	if !ok {
		return "", errors.New("this system cannot cut a replica's network")
	}
	victims := p.Partitionable()
	if len(victims) == 0 {
		return "", errors.New("no replica behind a proxy of its own (start the stack with Config.Partitions)")
	}
	v := victims[r.intn(len(victims))]
	shape := stack.CutShapes[r.intn(len(stack.CutShapes))]
	d := PartitionMin + time.Duration(r.intn(int((PartitionMax-PartitionMin)/time.Millisecond)))*time.Millisecond
	var peers []string
	for _, o := range victims {
		if o != v && processOf(o) == processOf(v) {
			peers = append(peers, o)
		}
	}
	offsets := map[string]int64{}
	for _, n := range append(slices.Clone(peers), v) {
		offsets[n] = fileSize(p.LogPath(n))
	}
	if err := p.Cut(v, shape); err != nil {
		return v, errors.Join(err, p.Heal(v))
	}
	start := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	healErr := p.Heal(v)
	took := time.Since(start)

	fenced, moved := false, 0
	victimLog := readFrom(p.LogPath(v), offsets[v])
	ids := map[string]bool{}
	for _, m := range fenceLine.FindAllStringSubmatch(victimLog, -1) {
		fenced = true
		ids[m[1]] = true
	}
	for _, peer := range peers {
		for _, m := range takeoverLine.FindAllStringSubmatch(readFrom(p.LogPath(peer), offsets[peer]), -1) {
			if ids[m[1]] {
				moved++
			}
		}
	}
	r.mu.Lock()
	r.parts.Shapes[shape]++
	r.parts.LeasesMoved += moved
	if fenced {
		r.parts.Fenced++
	}
	r.parts.LongestMS = max(r.parts.LongestMS, took.Milliseconds())
	r.mu.Unlock()
	what := fmt.Sprintf("%s cut (%s) for %.1f s, healed: fenced %t, %d lease(s) taken over by a peer meanwhile", v, shape, took.Seconds(), fenced, moved)
	if healErr != nil {
		return what, fmt.Errorf("heal: %w", healErr)
	}
	return what, r.waitReady(ctx, v)
}

// processOf is the process of an instance name ("hotel" of "hotel-2").
func processOf(instance string) string {
	if i := strings.LastIndexByte(instance, '-'); i > 0 {
		if _, err := strconv.Atoi(instance[i+1:]); err == nil {
			return instance[:i]
		}
	}
	return instance
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns the file at path from offset on ("" when unreadable).
func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
