package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The scaling curve (issue 23 item 4): the same closed loop and open loop
// on the system started afresh with 1, 2, 4... replicas of every service
// and on one NATS server or a JetStream cluster, on the one PostgreSQL
// cluster, in the same run, so that what saturates first shows as the
// points flatten.

// Environment of the bench's stack process (`tripsaga bench stack`): the
// replicas of every service and the NATS servers it runs.
const (
	replicasEnv  = "TRIPSAGA_BENCH_REPLICAS"
	natsNodesEnv = "TRIPSAGA_BENCH_NATS_NODES"
)

// stackShape is what the stack process runs; the zero value is one
// process of every service and one embedded NATS server.
type stackShape struct {
	Replicas, NATSNodes int
}

// suffix names the shape's folder and log ("" for the zero value,
// "-r2-n3" for 2 replicas on 3 NATS servers).
func (s stackShape) suffix() string {
	if s.Replicas == 0 {
		return ""
	}
	return "-r" + strconv.Itoa(s.Replicas) + "-n" + strconv.Itoa(max(s.NATSNodes, 1))
}

// ScalePoint is one point of the scaling curve.
type ScalePoint struct {
	Replicas  int `json:"replicas"`   // of every service
	NATSNodes int `json:"nats_nodes"` // 1: one embedded server; 3: a JetStream cluster, streams replicated 3 times
	// Clients of the closed loop: the client count of the best closed
	// loop of the run (the largest --concurrency when none settled).
	Clients   int     `json:"clients"`
	TripsPerS float64 `json:"trips_per_s"`
	// AnswerP50MS and AnswerP99MS are the closed loop's answer times, ms.
	AnswerP50MS float64 `json:"answer_p50_ms"`
	AnswerP99MS float64 `json:"answer_p99_ms"`
	// OpenP99MS is the answer p99 of an open loop offered half of this
	// point's trips/s for --open-seconds (0: no open loop).
	OpenP99MS float64 `json:"open_p99_ms,omitempty"`
	// CPUMSPerTrip is every process's CPU over the closed loop (PostgreSQL,
	// NATS, every replica, the simulators, the bench), ms per confirmed trip.
	CPUMSPerTrip float64 `json:"cpu_ms_per_trip"`
	// Settled as in [LoadRun]: every trip of both loops confirmed and none
	// left pending.
	Settled bool   `json:"settled"`
	Note    string `json:"note,omitempty"`
}

// runScaling measures every point of Config.Replicas × Config.NATSNodes,
// each on a stack of its own started on the cluster at databaseURL and
// stopped before the next.
func runScaling(ctx context.Context, cfg Config, rep *Report, databaseURL string, pmPid int) error {
	clients := slices.Max(cfg.Concurrency)
	for _, r := range rep.ClosedLoop {
		if r.Settled && r.AchievedPerS == rep.TripsPerS {
			clients = r.Clients
		}
	}
	nodes := cfg.NATSNodes
	if len(nodes) == 0 {
		nodes = []int{1}
	}
	for _, n := range nodes {
		for _, r := range cfg.Replicas {
			p, err := scalePoint(ctx, cfg, databaseURL, pmPid, stackShape{Replicas: r, NATSNodes: n}, clients)
			if err != nil {
				return err
			}
			rep.Scaling = append(rep.Scaling, p)
			rep.Settled = rep.Settled && p.Settled
		}
	}
	return nil
}

func scalePoint(ctx context.Context, cfg Config, databaseURL string, pmPid int, shape stackShape, clients int) (ScalePoint, error) {
	p := ScalePoint{Replicas: shape.Replicas, NATSNodes: shape.NATSNodes, Clients: clients}
	cfg.Logger.Info("bench: scaling point, starting the system", "replicas", shape.Replicas, "nats_nodes", shape.NATSNodes)
	child, info, err := startStack(ctx, cfg, databaseURL, shape)
	if err != nil {
		return p, err
	}
	defer child.stop()
	if len(info.Trips) == 0 {
		return p, fmt.Errorf("bench: the stack of %d replicas named no trips replica", shape.Replicas)
	}
	l := newReplicaLoader(info.Trips, cfg.Progress)
	var notes []string
	if n := min(100, cfg.Trips/10); n >= 5 {
		warm := l.closedLoop(ctx, n, clients)
		settle(ctx, l, warm, nil)
		if !warm.Settled {
			notes = append(notes, "warm-up: "+warm.SettledNote)
		}
	}
	meter := cpuMeter{stackPid: child.cmd.Process.Pid, postmasterPid: pmPid}
	cfg.Logger.Info("bench: scaling point, closed loop", "replicas", shape.Replicas, "nats_nodes", shape.NATSNodes, "clients", clients, "trips", cfg.Trips)
	c0 := meter.sample()
	run := l.closedLoop(ctx, cfg.Trips, clients)
	c1 := meter.sample()
	settle(ctx, l, run, nil)
	p.TripsPerS, p.AnswerP50MS, p.AnswerP99MS = run.AchievedPerS, run.Answer.P50, run.Answer.P99
	if run.Confirmed > 0 {
		var total float64
		for k, v := range c1.ms {
			total += v - c0.ms[k]
		}
		p.CPUMSPerTrip = round(total/float64(run.Confirmed), 2)
	}
	p.Settled = run.Settled
	if !run.Settled {
		notes = append(notes, "closed loop: "+run.SettledNote)
	}
	if cfg.OpenSeconds > 0 && run.AchievedPerS > 0 {
		open := l.openLoop(ctx, run.AchievedPerS/2, dur(cfg.OpenSeconds), 50)
		settle(ctx, l, open, nil)
		p.OpenP99MS = open.Answer.P99
		p.Settled = p.Settled && open.Settled
		if !open.Settled {
			notes = append(notes, "open loop: "+open.SettledNote)
		}
	}
	p.Note = strings.Join(notes, "; ")
	return p, nil
}
