package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
)

// DisruptPGFailover kills the primary of the stack's PostgreSQL pair
// (pg_auto_failover: monitor, primary, synchronous standby) with SIGKILL,
// keeper and postmaster, waits until the monitor has promoted the standby
// and a write commits through the multi-host URL, then runs the old
// primary again and waits until it has rejoined as the new primary's
// standby, so the next failover finds a pair again (a second failover
// before the rejoin would have no standby to go to). Only on a pair
// (`tripsaga chaos --pg-ha`, stack.Config.PGHA); it is not one of
// [Disruptions] ("all" takes it only on a pair, see [ParseFaults]).
const DisruptPGFailover = "pg-failover"

// PGFailover is one failover of a run ([DisruptPGFailover]); durations
// are from the kill, in ms.
type PGFailover struct {
	At       time.Time `json:"at"`
	Killed   string    `json:"killed"`
	Promoted string    `json:"promoted"`
	// WritableMS: until the first write committed through the multi-host
	// URL.
	WritableMS int64 `json:"writable_ms"`
	// RejoinedMS: until the old primary was the new one's standby.
	RejoinedMS int64 `json:"rejoined_ms"`
}

// pgFailer is the part of a [System] whose PostgreSQL is a pair that can
// fail over (*stack.Stack with Config.PGHA).
type pgFailer interface {
	FailOver(ctx context.Context) (pgcluster.Failover, error)
}

// ParseFaults parses `--faults` as [ParseDisruptionsOn] does (replicas:
// the processes of every service, for [DisruptPartition]), with
// [DisruptPGFailover] besides: refused, naming the flag, unless pgHA (the
// run is on a PostgreSQL pair, `--pg-ha`); "all" includes it on a pair.
func ParseFaults(s string, natsCluster, replicas int, pgHA bool) ([]string, error) {
	var rest []string
	pg, all := false, false
	for _, k := range strings.Split(s, ",") {
		switch k = strings.TrimSpace(k); k {
		case DisruptPGFailover:
			pg = true
		case "all":
			all = true
			rest = append(rest, k)
		default:
			rest = append(rest, k)
		}
	}
	if pg && !pgHA {
		return nil, fmt.Errorf("--faults: %s needs a PostgreSQL HA pair (--pg-ha; pg_autoctl from postgresql-15-auto-failover)", DisruptPGFailover)
	}
	out, err := ParseDisruptionsOn(strings.Join(rest, ","), natsCluster, replicas)
	if err != nil {
		return nil, err
	}
	if pg || (all && pgHA) {
		out = append(out, DisruptPGFailover)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// pgFailover fails the pair over and records the failover's times.
func (r *run) pgFailover(ctx context.Context) (string, error) {
	p, ok := r.sys.(pgFailer)
	if !ok {
		return "", errors.New("this system's PostgreSQL cannot fail over (not a pg_auto_failover pair)")
	}
	f, err := p.FailOver(ctx)
	if err != nil {
		return f.Killed, err
	}
	r.mu.Lock()
	r.failovers = append(r.failovers, PGFailover{
		At: f.At.UTC(), Killed: f.Killed, Promoted: f.Promoted,
		WritableMS: f.Writable.Milliseconds(), RejoinedMS: f.Rejoined.Milliseconds(),
	})
	r.mu.Unlock()
	return fmt.Sprintf("PostgreSQL primary %s SIGKILLed: %s promoted, writable after %s; %s rejoined as standby after %s",
		f.Killed, f.Promoted, f.Writable.Round(100*time.Millisecond), f.Killed, f.Rejoined.Round(100*time.Millisecond)), nil
}
