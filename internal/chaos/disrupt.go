package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

// The kinds of disruption a chaos run draws from (`tripsaga chaos
// --faults`, [Config.Disruptions]): one of those given, at random, every
// [Config.KillEvery]. The company faults ([Config.Faults]) are drawn by
// the simulators on every call besides, whatever is given here.
const (
	// DisruptKill SIGKILLs a random service replica or NATS node; the
	// supervisor starts it again and the next disruption waits until it is
	// ready.
	DisruptKill = "kill"
	// DisruptStepDown asks the JetStream leader of a random event stream,
	// or of one of its consumers, to step down (the JetStream API's
	// $JS.API.STREAM.LEADER.STEPDOWN.<stream> and
	// $JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>, as `nats
	// stream cluster step-down` does): another node is elected while
	// events are published and consumed. Only with a NATS cluster.
	DisruptStepDown = "step-down"
	// DisruptEmptyStore SIGKILLs a NATS node and restarts it with its
	// store folder emptied, as a node whose disk was replaced: it must
	// catch every stream up from its peers. Only with a NATS cluster.
	DisruptEmptyStore = "empty-store"
	// DisruptLoseAcked deletes from a random event stream one of its most
	// recent events, one that its relay already had the PubAck for (the
	// JetStream API's $JS.API.STREAM.MSG.DELETE): what a power loss of the
	// NATS host before its fsync loses, or a restore from an older
	// snapshot, or a person deleting a message by hand. The outbox's check
	// of what the broker kept must publish it again; the audit looks for
	// every one of them by its Nats-Msg-Id ([Report.LostEvents]).
	DisruptLoseAcked = "lose-acked"
	// DisruptPartition cuts one random service replica's network (its own
	// TCP proxies, stack.Config.Partitions) for a random 2 to 12 s, in a
	// random shape of stack.CutShapes: blackholed from PostgreSQL, its
	// PostgreSQL connections reset, blackholed from NATS, or from both;
	// then heals it. A replica cut from PostgreSQL fences itself after 3 s
	// and a peer takes its leases after the takeover bound (6 s with the
	// default call timeout), so the audit's "calls in flight twice" is the
	// check of the fencing. Only with 2 or more replicas of every service
	// ([ParseDisruptionsOn]); counted in [Report.Partitions].
	DisruptPartition = "partition"
)

// Disruptions lists every disruption kind, in the order the report shows
// them.
var Disruptions = []string{DisruptKill, DisruptStepDown, DisruptEmptyStore, DisruptLoseAcked, DisruptPartition} //nolint:gochecknoglobals // read-only

// ParseDisruptions parses `--faults`: a comma-separated list of kinds
// ([Disruptions]), or "all". A kind that needs a NATS cluster is refused
// without one (natsCluster < 3), naming it. It does not know the replicas:
// [ParseDisruptionsOn] also refuses a partition without a peer.
func ParseDisruptions(s string, natsCluster int) ([]string, error) {
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		switch {
		case k == "":
			continue
		case k == "all":
			for _, d := range Disruptions {
				if natsCluster >= 3 || !needsCluster(d) {
					out = append(out, d)
				}
			}
			continue
		case !slices.Contains(Disruptions, k):
			return nil, fmt.Errorf("--faults: unknown kind %q (want a comma-separated list of %s, or all)", k, strings.Join(Disruptions, ", "))
		case needsCluster(k) && natsCluster < 3:
			return nil, fmt.Errorf("--faults: %s needs a NATS cluster (--nats-cluster 3)", k)
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func needsCluster(kind string) bool { return kind == DisruptStepDown || kind == DisruptEmptyStore }

// emptyStoreKiller is the part of a [System] that can restart a NATS node
// with an empty store (*stack.Stack).
type emptyStoreKiller interface {
	KillEmptyStore(instance string) (pid int, err error)
}

// LostEvent is an event the run deleted from its stream after its PubAck
// ([DisruptLoseAcked]) and whether the audit found it there again.
type LostEvent struct {
	Stream  string `json:"stream"`
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	// MsgID is its Nats-Msg-Id: the event's id.
	MsgID string `json:"msg_id"`
	// FoundAgain: the stream holds an event of that subject with that
	// Nats-Msg-Id again, at AgainSeq.
	FoundAgain bool   `json:"found_again"`
	AgainSeq   uint64 `json:"again_seq,omitempty"`
}

// disruptor holds the admin's NATS connection of a run's disruptions.
type disruptor struct {
	nc *nats.Conn
	js jetstream.JetStream
	// timeout and wait bound a JetStream API request and its asking
	// again ([disruptor.request]); zero: apiRequestTimeout and
	// apiRequestWait.
	timeout, wait time.Duration
}

// connectAdmin connects to NATS as the admin identity (Config.NATSURL,
// NATSCreds).
func (r *run) connectAdmin() (*disruptor, error) {
	if r.cfg.NATSURL == "" {
		return nil, errors.New("chaos: no NATS URL for the step-down and lose-acked disruptions")
	}
	opts, err := natsauth.Client{Creds: r.cfg.NATSCreds}.Options(natsauth.Admin)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(r.cfg.NATSURL, append(opts, nats.Name("tripsaga-chaos-disruptions"), nats.Timeout(5*time.Second), nats.MaxReconnects(-1))...)
	if err != nil {
		return nil, fmt.Errorf("chaos: NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &disruptor{nc: nc, js: js}, nil
}

// eventStreams names the streams of events (not DEADLETTER nor
// OPERATOR), from the server.
func (d *disruptor) eventStreams(ctx context.Context) ([]string, error) {
	var out []string
	names := d.js.StreamNames(ctx)
	for n := range names.Name() {
		if n != events.StreamDeadLetter && n != events.StreamOperator {
			out = append(out, n)
		}
	}
	if err := names.Err(); err != nil {
		return nil, err
	}
	slices.Sort(out)
	if len(out) == 0 {
		return nil, errors.New("no event stream")
	}
	return out, nil
}

// disrupt carries out one disruption of kind, on a victim drawn from
// victims (kill), and returns what it did in a few words.
func (r *run) disrupt(ctx context.Context, kind string, victims []string) (string, error) {
	switch kind {
	case DisruptKill:
		v := victims[r.intn(len(victims))]
		pid, err := r.sys.Kill(v)
		if err != nil {
			return v, err
		}
		r.mu.Lock()
		r.kills[v]++
		r.mu.Unlock()
		return fmt.Sprintf("%s (pid %d) SIGKILLed", v, pid), r.waitReady(ctx, v)
	case DisruptEmptyStore:
		k, ok := r.sys.(emptyStoreKiller)
		if !ok {
			return "", errors.New("this system cannot restart a NATS node with an empty store")
		}
		var nodes []string
		for _, v := range victims {
			if strings.HasPrefix(v, "nats-") {
				nodes = append(nodes, v)
			}
		}
		if len(nodes) == 0 {
			return "", errors.New("no NATS node")
		}
		v := nodes[r.intn(len(nodes))]
		pid, err := k.KillEmptyStore(v)
		if err != nil {
			return v, err
		}
		r.mu.Lock()
		r.kills[v]++
		r.mu.Unlock()
		return fmt.Sprintf("%s (pid %d) SIGKILLed, restarted with an empty store", v, pid), r.waitReady(ctx, v)
	case DisruptStepDown:
		return r.stepDown(ctx)
	case DisruptLoseAcked:
		return r.loseAcked(ctx)
	case DisruptPartition:
		return r.partition(ctx)
	case DisruptPGFailover:
		return r.pgFailover(ctx)
	}
	return "", fmt.Errorf("unknown disruption %q", kind)
}

// waitReady waits (at most 2 minutes) until instance answers /readyz.
func (r *run) waitReady(ctx context.Context, instance string) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := r.sys.WaitReady(wctx, instance); err != nil {
		return fmt.Errorf("%s not ready again: %s", instance, firstLine(err.Error()))
	}
	return nil
}

// apiError is the error of a JetStream API answer.
type apiError struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// Bounds of a JetStream API request of the disruptions ([disruptor.request]).
const (
	// apiRequestTimeout bounds one request: only the leader of a stream
	// or consumer answers its step-down, and none does while it is being
	// elected or its node restarts, so an unbounded request (the run's
	// context has no deadline) waited for ever and stopped every later
	// disruption of the run.
	apiRequestTimeout = 10 * time.Second
	// apiRequestWait bounds the asking again of one request.
	apiRequestWait = time.Minute
)

// request sends a JetStream API request and returns its answer, asking
// again while none comes within apiRequestTimeout (a leader being
// elected; the JetStream docs: API requests may time out during leader
// elections) or no server listens yet, for at most apiRequestWait.
func (d *disruptor) request(ctx context.Context, subject string) (*nats.Msg, error) {
	timeout, wait := cmp.Or(d.timeout, apiRequestTimeout), cmp.Or(d.wait, apiRequestWait)
	deadline := time.Now().Add(wait)
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		msg, err := d.nc.RequestWithContext(rctx, subject, nil)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) ||
			!(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)) {
			return msg, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stepDown asks a random event stream's leader, or one of its
// consumers' leaders, to step down.
func (r *run) stepDown(ctx context.Context) (string, error) {
	d := r.admin
	streams, err := d.eventStreams(ctx)
	if err != nil {
		return "", err
	}
	stream := streams[r.intn(len(streams))]
	subject, what := "$JS.API.STREAM.LEADER.STEPDOWN."+stream, "stream "+stream
	if r.intn(2) == 0 {
		var consumers []string
		if s, err := d.js.Stream(ctx, stream); err == nil {
			names := s.ConsumerNames(ctx)
			for n := range names.Name() {
				consumers = append(consumers, n)
			}
		}
		if len(consumers) > 0 {
			slices.Sort(consumers)
			c := consumers[r.intn(len(consumers))]
			subject, what = "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+c, "consumer "+stream+"/"+c
		}
	}
	msg, err := d.request(ctx, subject)
	if err != nil {
		return what, fmt.Errorf("step-down of %s: %w", what, err)
	}
	var ae apiError
	if err := json.Unmarshal(msg.Data, &ae); err != nil {
		return what, fmt.Errorf("step-down of %s: answer %q: %w", what, msg.Data, err)
	}
	if ae.Error != nil {
		return what, fmt.Errorf("step-down of %s: %d %s", what, ae.Error.ErrCode, ae.Error.Description)
	}
	return "leader of " + what + " stepped down", nil
}

// loseAcked deletes one of the 20 newest events of a random event stream
// and records it in r.lost.
func (r *run) loseAcked(ctx context.Context) (string, error) {
	d := r.admin
	streams, err := d.eventStreams(ctx)
	if err != nil {
		return "", err
	}
	name := streams[r.intn(len(streams))]
	s, err := d.js.Stream(ctx, name)
	if err != nil {
		return name, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return name, err
	}
	if info.State.Msgs == 0 {
		return name + " is empty: nothing lost", nil
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	lo := first
	if last > 20 && last-20 > first {
		lo = last - 20
	}
	for range 5 {
		seq := lo + uint64(r.intn(int(last-lo+1)))
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted before
		}
		if err != nil {
			return name, err
		}
		if err := s.DeleteMsg(ctx, seq); err != nil {
			return name, fmt.Errorf("delete %s #%d: %w", name, seq, err)
		}
		r.mu.Lock()
		r.lost = append(r.lost, LostEvent{Stream: name, Seq: seq, Subject: m.Subject, MsgID: m.Header.Get(jetstream.MsgIDHeader)})
		r.mu.Unlock()
		return fmt.Sprintf("%s #%d (%s) deleted", name, seq, m.Subject), nil
	}
	return name + ": no event to delete among the newest", nil
}

// waitLostFound looks for the events the run deleted until every one is
// in its stream again or 5 minutes have passed (the outbox's check of what
// the broker kept runs on its own timer), and returns what it found.
func (r *run) waitLostFound(ctx context.Context, lost []LostEvent) []LostEvent {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		found := r.findLost(ctx, lost)
		if !slices.ContainsFunc(found, func(l LostEvent) bool { return !l.FoundAgain }) || time.Now().After(deadline) || ctx.Err() != nil {
			return found
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// findLost looks, for every event the run deleted, for an event of its
// subject with its Nats-Msg-Id in its stream, and records what it found.
func (r *run) findLost(ctx context.Context, lost []LostEvent) []LostEvent {
	d := r.admin
	out := slices.Clone(lost)
	for i := range out {
		l := &out[i]
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		seq, err := findMsgID(ctx, d.js, l.Stream, l.Subject, l.MsgID)
		cancel()
		if err != nil {
			r.cfg.Logger.Warn("chaos: looking for a lost event", "stream", l.Stream, "subject", l.Subject, "err", err)
			continue
		}
		l.FoundAgain, l.AgainSeq = seq > 0, seq
	}
	return out
}

// findMsgID returns the sequence of the message of subject in stream
// whose Nats-Msg-Id is id, or 0 when there is none.
func findMsgID(ctx context.Context, js jetstream.JetStream, stream, subject, id string) (uint64, error) {
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	for pending := info.NumPending; pending > 0; {
		batch, err := c.Fetch(int(min(pending, 100)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return 0, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return 0, err
			}
			if m.Headers().Get(jetstream.MsgIDHeader) == id {
				return meta.Sequence.Stream, nil
			}
			pending = meta.NumPending
		}
		if err := batch.Error(); err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, errors.New("no message within 5 s while some were pending")
		}
	}
	return 0, nil
}
