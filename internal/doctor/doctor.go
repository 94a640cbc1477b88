// Package doctor checks the live JetStream configuration (streams,
// consumers, cluster size) together with the process's own settings (relay
// backoff, inbox limits, replay window) against the rules the guarantees
// rest on, and returns every violation with its reason and where the rule
// comes from. `tripsaga doctor` prints the findings; every service runs
// [Check] at start (process) and refuses to start on any finding.
//
// The rules (each [Finding]'s Rule):
//
//   - relay-backoff: the outbox relay's longest backoff and its LocalGrace
//     must stay well inside (below half of) the duplicate window of each
//     stream it publishes to (all but the dead-letter stream), or a
//     re-publish after the window is stored twice (NATS docs, "Message
//     Deduplication"; field notes, JetStream; nats-server #7302).
//   - ack-wait-short: a tripsaga inbox consumer's AckWait must exceed the
//     slowest handler (a batch transaction plus its wait in the client's
//     prefetch buffer), or an event still being handled is redelivered
//     (field notes, JetStream; nats.go #1929).
//   - ack-wait-default, max-deliver-default: a durable consumer's AckWait
//     and MaxDeliver must be set explicitly (field notes, JetStream: the
//     server's defaults are 30 s and unlimited). The server stores an unset
//     value as its default, so AckWait = 30 s is taken for unset, and
//     MaxDeliver = -1 is accepted only on a tripsaga inbox consumer, which
//     sets it explicitly and parks an event itself at its own MaxDeliver.
//   - max-deliver-server: a tripsaga inbox consumer must have MaxDeliver -1
//     on the server: a server limit drops an event without a trace (no
//     dead-letter queue; field notes, JetStream), before the inbox parks it.
//   - nats-sync: the server must fsync every message before its PubAck
//     (sync_interval: always, internal/natssync); checked by [CheckSync]
//     on what [SyncOf] reads from its monitoring port, since the client
//     connection cannot see it (`tripsaga doctor --nats-monitor`).
//   - stream-retention: event streams use limits retention, never
//     work-queue or interest: the trips service, the reconciler and replays
//     each read every event (field notes, JetStream; NATS docs, "Streams").
//   - stream-storage: event streams are file-backed; a memory stream loses
//     every event when the server restarts (NATS docs, "Streams").
//   - stream-max-age: a stream's MaxAge (0 = unlimited) must be at least the
//     longest replay (Config.ReplayWindow), and no longer than the inbox
//     keeps its rows (Config.InboxRetention, 0 = forever), or a replayed or
//     redelivered event whose inbox row is gone is applied twice (field
//     notes, "Inbox retention must outlast ... every replay").
//   - stream-replicas: a stream's replicas (live, and the ones the process
//     would ask for) must not exceed the cluster size (NATS docs,
//     "JetStream Clustering").
//   - stream-missing: with Config.RequireStreams, every event stream exists.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
)

// Rule names, the Rule of a [Finding].
const (
	RuleRelayBackoff      = "relay-backoff"
	RuleAckWaitShort      = "ack-wait-short"
	RuleAckWaitDefault    = "ack-wait-default"
	RuleMaxDeliverDefault = "max-deliver-default"
	RuleMaxDeliverServer  = "max-deliver-server"
	RuleStreamRetention   = "stream-retention"
	RuleStreamStorage     = "stream-storage"
	RuleStreamMaxAge      = "stream-max-age"
	RuleStreamReplicas    = "stream-replicas"
	RuleStreamMissing     = "stream-missing"
)

// Where the rules come from, the Source of a [Finding].
const (
	srcDedup    = "NATS docs, JetStream \"Message Deduplication\"; field notes, JetStream (nats-server #7302, #3272, #2921)"
	srcAckWait  = "field notes, JetStream (AckWait runs from the server's delivery, nats.go #1929)"
	srcDefaults = "field notes, JetStream (\"MaxDeliver defaults to unlimited and AckWait to 30 s: set both explicitly per consumer\")"
	srcNoDLQ    = "field notes, JetStream (no dead-letter queue: after MaxDeliver only an advisory is published)"
	srcLimits   = "field notes, JetStream (\"Event streams use limits retention (not work-queue)\"); NATS docs, JetStream \"Streams\" (RetentionPolicy)"
	srcStorage  = "NATS docs, JetStream \"Streams\" (StorageType: memory is not persisted across a server restart)"
	srcMaxAge   = "field notes, JetStream (stream limits can drop messages nobody consumed) and PostgreSQL outbox (\"Inbox retention must outlast the longest redelivery and every replay\")"
	srcReplicas = "NATS docs, JetStream \"Clustering\" (a stream's replicas are placed on distinct servers of the cluster)"
	srcMissing  = "docs/how-it-works.md, \"Events, streams and subjects\" (events.EnsureStreams)"
)

// serverAckWaitDefault is what the server stores for an explicit-ack
// consumer created without AckWait (nats-server JsAckWaitDefault).
const serverAckWaitDefault = 30 * time.Second

// SlowestHandlerDefault is the longest an inbox handler may take, in the
// process's own terms: one batch transaction of at most 256 events in
// PostgreSQL (inbox rows, the effect, outbox rows; tens of ms measured in
// BENCHMARKS.md) plus its wait in the client's prefetch buffer. Handlers
// never call a company (company calls run from the step log), so this
// stays far below the inbox's 5 s AckWait.
const SlowestHandlerDefault = 2 * time.Second

// Finding is one violation: which rule, on what (a stream, a consumer, the
// relay, the cluster), why, and where the rule comes from.
type Finding struct {
	Rule   string `json:"rule"`   // one of the Rule* constants
	Object string `json:"object"` // e.g. "stream HOTEL", "consumer payment on HOTEL"
	Reason string `json:"reason"`
	Source string `json:"source"` // the NATS docs, the field notes, an issue
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s: %s (%s)", f.Object, f.Rule, f.Reason, f.Source)
}

// Config is the process's own side of the checks. [DefaultConfig] is what
// every service runs with.
type Config struct {
	// Streams are the stream names checked; others in the account are not
	// ours and are ignored. Defaults to the catalogue's streams and
	// events.StreamDeadLetter.
	Streams []string
	// Inboxes are the durable consumer names of tripsaga inboxes (they set
	// MaxDeliver -1 on the server and enforce InboxMaxDeliver themselves).
	Inboxes []string
	// RelayBackoffMax and RelayLocalGrace are the outbox relay's settings
	// (outbox.RelayConfig); each must stay below half of every stream's
	// live duplicate window.
	RelayBackoffMax, RelayLocalGrace time.Duration
	// InboxMaxDeliver is the delivery at which an inbox parks a failing
	// event (inbox.Config.MaxDeliver); at least 2.
	InboxMaxDeliver int
	// InboxAckWait is the AckWait the process's inboxes create their
	// consumers with (inbox.Config.AckWait); it must exceed
	// SlowestHandler, as must every live inbox consumer's.
	InboxAckWait time.Duration
	// SlowestHandler is the longest an inbox handler may take (see
	// [SlowestHandlerDefault]); an inbox consumer's AckWait must exceed it.
	SlowestHandler time.Duration
	// ReplayWindow is the longest replay the system promises: a stream's
	// MaxAge, unless 0 (unlimited), must be at least this.
	ReplayWindow time.Duration
	// InboxRetention is how long inbox rows are kept; 0 means forever (no
	// code deletes them). When set, a stream's MaxAge must be set and no
	// longer.
	InboxRetention time.Duration
	// StreamReplicas is the replica count the process asks for when it
	// creates streams: STREAM_REPLICAS (process.Env.StreamReplicas, 1 when
	// unset; `tripsaga up --nats-cluster 3` sets 3). Services and
	// `tripsaga doctor` set it from there; DefaultConfig says 1.
	StreamReplicas int
	// RequireStreams makes a missing stream a finding (for `tripsaga
	// doctor`); at a service's start a missing stream is simply created
	// afterwards.
	RequireStreams bool
}

// DefaultConfig returns the configuration the services of catalogue c
// (STEPS, process.Env.Steps) run with: its streams and inboxes, the outbox package's relay and inbox
// defaults, a replay window of events.MaxAge, inbox rows kept forever, and
// one replica per stream.
func DefaultConfig(c events.Catalogue) Config {
	streams := slices.Sorted(maps.Keys(c.StreamSubjects()))
	streams = append(streams, events.StreamDeadLetter)
	// The inboxes of every trip version's services, not only of STEPS':
	// the insurer's consumers stay (and go on finishing the insured
	// trips) after STEPS turned insurance off.
	inboxes := map[string]bool{}
	for _, v := range append(events.Versions(), c) {
		for _, s := range v.Steps {
			inboxes[s.Service] = true
		}
		for _, p := range v.Projections {
			inboxes[p.Name] = true
		}
	}
	return Config{
		Streams:         streams,
		Inboxes:         slices.Sorted(maps.Keys(inboxes)),
		RelayBackoffMax: outbox.RelayBackoffMaxDefault,
		RelayLocalGrace: outbox.RelayLocalGraceDefault,
		InboxMaxDeliver: inbox.MaxDeliverDefault,
		InboxAckWait:    inbox.AckWaitDefault,
		SlowestHandler:  SlowestHandlerDefault,
		ReplayWindow:    events.MaxAge,
		StreamReplicas:  1,
	}
}

// Err returns nil for no findings, or an error wrapping [ErrViolation]
// that names every finding, one a line.
func Err(fs []Finding) error {
	if len(fs) == 0 {
		return nil
	}
	lines := make([]string, 0, len(fs))
	for _, f := range fs {
		lines = append(lines, "  "+f.String())
	}
	return fmt.Errorf("%w (%d violations; see tripsaga doctor):\n%s", ErrViolation, len(fs), strings.Join(lines, "\n"))
}

// Check reads the live state from the server nc is connected to (the info
// of every stream of cfg.Streams and of their consumers, and the cluster
// size) and returns the findings, ordered by object. The error is for the
// state that could not be read, never for a violation.
func Check(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg Config) ([]Finding, error) {
	var fs []Finding
	add := func(rule, object, source, format string, args ...any) {
		fs = append(fs, Finding{Rule: rule, Object: object, Reason: fmt.Sprintf(format, args...), Source: source})
	}
	inbox := map[string]bool{}
	for _, n := range cfg.Inboxes {
		inbox[n] = true
	}
	if cfg.InboxMaxDeliver < 2 {
		add(RuleMaxDeliverDefault, "inbox configuration", srcDefaults, "the inbox's MaxDeliver %d is below 2: it would park an event at its first failure", cfg.InboxMaxDeliver)
	}
	if cfg.InboxAckWait <= cfg.SlowestHandler {
		add(RuleAckWaitShort, "inbox configuration", srcAckWait, "the inboxes' AckWait %s is not longer than the slowest handler (%s): an event still being handled would be redelivered", cfg.InboxAckWait, cfg.SlowestHandler)
	}
	var infos []*jetstream.StreamInfo
	for _, name := range cfg.Streams {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if cfg.RequireStreams {
				add(RuleStreamMissing, "stream "+name, srcMissing, "stream %s does not exist (a service creates it at start)", name)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("doctor: stream %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("doctor: stream %s info: %w", name, err)
		}
		infos = append(infos, info)
	}
	size := clusterSize(nc, infos)
	if cfg.StreamReplicas > size {
		add(RuleStreamReplicas, "stream configuration", srcReplicas, "streams are to be created with %d replicas but the cluster has %d server(s)", cfg.StreamReplicas, size)
	}
	for _, info := range infos {
		sc := info.Config
		obj := "stream " + sc.Name
		dup := sc.Duplicates
		if dup == 0 {
			dup = 2 * time.Minute // the server's default
		}
		relayed := sc.Name != events.StreamDeadLetter // the relay publishes to every stream but this one
		if relayed && cfg.RelayBackoffMax >= dup/2 {
			add(RuleRelayBackoff, obj, srcDedup, "the relay's longest backoff %s is not well inside (below half of) the %s duplicate window: a re-publish after the window is stored twice", cfg.RelayBackoffMax, dup)
		}
		if relayed && cfg.RelayLocalGrace >= dup/2 {
			add(RuleRelayBackoff, obj, srcDedup, "the relay's LocalGrace %s is not well inside (below half of) the %s duplicate window: a re-publish after the window is stored twice", cfg.RelayLocalGrace, dup)
		}
		switch sc.Retention {
		case jetstream.LimitsPolicy:
		case jetstream.WorkQueuePolicy:
			add(RuleStreamRetention, obj, srcLimits, "work-queue retention deletes an event once one consumer acks it: the other services, the reconciler and replays never see it; use limits retention")
		default:
			add(RuleStreamRetention, obj, srcLimits, "%s retention deletes an event once the consumers present ack it: replays and a consumer created later never see it; use limits retention", sc.Retention)
		}
		if sc.Storage != jetstream.FileStorage {
			add(RuleStreamStorage, obj, srcStorage, "%s storage loses every event when the NATS server restarts; use file storage", sc.Storage)
		}
		if sc.MaxAge > 0 && sc.MaxAge < cfg.ReplayWindow {
			add(RuleStreamMaxAge, obj, srcMaxAge, "max age %s is shorter than the longest replay (%s): a replay or a consumer that fell behind misses events the stream dropped", sc.MaxAge, cfg.ReplayWindow)
		}
		if cfg.InboxRetention > 0 && (sc.MaxAge == 0 || sc.MaxAge > cfg.InboxRetention) {
			age := "unlimited"
			if sc.MaxAge > 0 {
				age = sc.MaxAge.String()
			}
			add(RuleStreamMaxAge, obj, srcMaxAge, "max age %s outlasts the inbox retention %s: an event replayed or redelivered after its inbox row is deleted is applied twice", age, cfg.InboxRetention)
		}
		if sc.Replicas > size {
			add(RuleStreamReplicas, obj, srcReplicas, "%d replicas but the cluster has %d server(s)", sc.Replicas, size)
		}
		cs, err := consumers(ctx, js, sc.Name)
		if err != nil {
			return nil, err
		}
		for _, ci := range cs {
			cc := ci.Config
			if cc.Durable == "" || cc.AckPolicy == jetstream.AckNonePolicy {
				continue // ephemeral or unacked (an ordered replay): nothing is redelivered
			}
			cobj := fmt.Sprintf("consumer %s on %s", cc.Durable, sc.Name)
			ours := inbox[cc.Durable]
			if cc.AckWait == serverAckWaitDefault && len(cc.BackOff) == 0 {
				add(RuleAckWaitDefault, cobj, srcDefaults, "AckWait is the server's default 30 s (what an unset AckWait becomes): set it explicitly for the handler")
			} else if ours && cc.AckWait <= cfg.SlowestHandler {
				add(RuleAckWaitShort, cobj, srcAckWait, "AckWait %s is not longer than the slowest handler (%s): an event still being handled is redelivered", cc.AckWait, cfg.SlowestHandler)
			}
			switch {
			case ours && cc.MaxDeliver != -1:
				add(RuleMaxDeliverServer, cobj, srcNoDLQ, "MaxDeliver %d on the server drops an event without a trace after %d deliveries; a tripsaga inbox needs -1 and parks the event itself at delivery %d", cc.MaxDeliver, cc.MaxDeliver, cfg.InboxMaxDeliver)
			case !ours && cc.MaxDeliver == -1:
				add(RuleMaxDeliverDefault, cobj, srcDefaults, "MaxDeliver is unlimited (the server's default, what an unset MaxDeliver becomes), and nothing parks a message that always fails: set it explicitly")
			}
		}
	}
	slices.SortStableFunc(fs, func(a, b Finding) int { return strings.Compare(a.Object, b.Object) })
	return fs, nil
}

func consumers(ctx context.Context, js jetstream.JetStream, stream string) ([]*jetstream.ConsumerInfo, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("doctor: stream %s: %w", stream, err)
	}
	var out []*jetstream.ConsumerInfo
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		out = append(out, ci)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("doctor: consumers of %s: %w", stream, err)
	}
	return out, nil
}

// clusterSize is 1 for a server outside a cluster; in a cluster, the larger
// of the servers the client knows (the explicit URLs and the cluster's
// gossiped client URLs) and the peers placed for any stream (offline ones
// included, so a node that is down does not shrink it).
func clusterSize(nc *nats.Conn, infos []*jetstream.StreamInfo) int {
	if nc == nil || nc.ConnectedClusterName() == "" {
		return 1
	}
	n := len(nc.Servers())
	for _, info := range infos {
		if info.Cluster != nil && info.Cluster.Leader != "" {
			n = max(n, 1+len(info.Cluster.Replicas))
		}
	}
	return max(n, 1)
}
