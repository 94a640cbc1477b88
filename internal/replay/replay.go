// Package replay re-drives one service's durable consumers from a point of
// their streams: `tripsaga replay <consumer> --from-seq N | --since T`.
//
// Without filters the consumer itself is moved back (JetStream's consumer
// reset, nats-server 2.14+, $JS.API.CONSUMER.RESET): the running service
// receives every event of its streams from that point again, through its
// inbox, which drops each event it has handled already; so no company sees
// a second effective call and no projection counts an event twice. With
// filters (a trip, an event type) only the matching events are handed to
// the consumer, each as an operator action (io.tripsaga.operator.action.v1,
// action redrive, on the OPERATOR stream) that the owning service carries
// out through the same inbox. A dry run prints what would be delivered and
// changes nothing.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"

	"github.com/tripsaga/tripsaga/events"
)

// ErrInvalid is wrapped by the errors [Run] returns for a bad [Config].
var ErrInvalid = errors.New("replay: invalid request")

// ErrRefused is wrapped by the errors [Run] returns when it cannot deliver
// exactly from the point asked: --from-seq N before a stream's first
// sequence (the events before it are gone), after its last, or before
// where the durable consumer starts (JetStream's consumer reset cannot go
// below a consumer's start: nats-server's resetStartingSeq answers "below
// start seq"). Nothing was replayed then, on any stream.
var ErrRefused = errors.New("replay: refused")

// Config is one replay.
type Config struct {
	// JetStream reaches the streams. Required.
	JetStream jetstream.JetStream
	// Catalogue says which streams and subjects the consumer reads.
	// Defaults to events.Default; the command passes STEPS' (process.Env.Steps).
	Catalogue *events.Catalogue
	// Consumer is the durable consumer (the service's name: hotel,
	// payment, car, trips, reconciler). Required.
	Consumer string
	// Stream limits the replay to one of the consumer's streams.
	Stream string
	// FromSeq or Since is the point to replay from: a stream sequence
	// (the same on every stream replayed, so mostly with Stream), or a
	// time (the first event of each stream stored at or after it).
	// Exactly one is required. A replay delivers every event of the
	// consumer's from FromSeq to the stream's last, or refuses (an error
	// wrapping ErrRefused) before it delivers anything: see ErrRefused.
	FromSeq uint64
	Since   time.Time
	// Trip and Type select the events (Type is an event type or its kind,
	// "hotel.held"); empty selects all.
	Trip, Type string
	// DryRun prints what would be delivered to Out and changes nothing.
	DryRun bool
	// Operator and Reason are recorded with a filtered replay's actions.
	Operator, Reason string
	// Out receives the dry run's lines. Progress, when set, shows a
	// progress bar.
	Out, Progress io.Writer
}

// StreamResult is what a replay did on one stream.
type StreamResult struct {
	Stream string `json:"stream"`
	// From and To are the first and last sequences replayed (From is
	// FromSeq when it was given).
	From uint64 `json:"from_seq"`
	To   uint64 `json:"to_seq"`
	// Events is how many events were (or, in a dry run, would be)
	// delivered to the consumer.
	Events int `json:"events"`
	// NoConsumer: the service has no durable consumer on the stream (the
	// trips service handles its own trip.* events inside the transaction
	// that publishes them), so a reset had nothing to move.
	NoConsumer bool `json:"no_consumer,omitempty"`
}

// Result is what a replay did.
type Result struct {
	Consumer string `json:"consumer"`
	// Mode is "reset" (the durable consumer moved back), "redrive" (the
	// matching events handed over as operator actions) or "dry-run".
	Mode    string         `json:"mode"`
	Streams []StreamResult `json:"streams"`
	Events  int            `json:"events"`
	// Duration is the wall time until the consumer had every event again
	// (acknowledged), or, in a dry run, until they were read.
	Duration time.Duration `json:"duration_ns"`
}

// EventsPerSecond is Events over Duration.
func (r Result) EventsPerSecond() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Events) / r.Duration.Seconds()
}

// Consumers lists the durable consumers a replay can re-drive: every
// service that consumes events in c.
func Consumers(c events.Catalogue) []string {
	var out []string
	for _, svc := range []string{"trips", "hotel", "payment", "car", "reconciler"} {
		if len(c.Consumes(svc)) > 0 {
			out = append(out, svc)
		}
	}
	for _, s := range c.Steps {
		if !slices.Contains(out, s.Service) && len(c.Consumes(s.Service)) > 0 {
			out = append(out, s.Service)
		}
	}
	return out
}

// filtersOf returns the consumer's streams and their filter subjects.
func filtersOf(c events.Catalogue, consumer string) map[string][]string {
	return c.Streams(c.Consumes(consumer))
}

// Run replays as cfg says; see the package doc.
func Run(ctx context.Context, cfg Config) (Result, error) {
	res := Result{Consumer: cfg.Consumer, Mode: "reset"}
	if cfg.Catalogue == nil {
		c := events.Default
		cfg.Catalogue = &c
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	streams := filtersOf(*cfg.Catalogue, cfg.Consumer)
	switch {
	case cfg.JetStream == nil:
		return res, fmt.Errorf("%w: JetStream is required", ErrInvalid)
	case len(streams) == 0:
		return res, fmt.Errorf("%w: %q consumes nothing; the consumers are %s", ErrInvalid, cfg.Consumer, strings.Join(Consumers(*cfg.Catalogue), ", "))
	case (cfg.FromSeq == 0) == cfg.Since.IsZero():
		return res, fmt.Errorf("%w: give the point to replay from: a stream sequence (--from-seq) or a time (--since)", ErrInvalid)
	case cfg.Stream != "" && streams[cfg.Stream] == nil:
		return res, fmt.Errorf("%w: %s does not read stream %s (it reads %s)", ErrInvalid, cfg.Consumer, cfg.Stream, strings.Join(sortedKeys(streams), ", "))
	}
	if cfg.Type != "" && events.Kind(cfg.Type) == "" {
		// A kind ("hotel.held"): the consumer's type of that kind.
		for _, t := range cfg.Catalogue.Consumes(cfg.Consumer) {
			if events.Kind(t) == cfg.Type {
				cfg.Type = t
				break
			}
		}
	}
	if cfg.Type != "" && !slices.Contains(cfg.Catalogue.Consumes(cfg.Consumer), cfg.Type) {
		return res, fmt.Errorf("%w: %s does not consume %s", ErrInvalid, cfg.Consumer, cfg.Type)
	}
	filtered := cfg.Trip != "" || cfg.Type != ""
	switch {
	case cfg.DryRun:
		res.Mode = "dry-run"
	case filtered:
		res.Mode = "redrive"
		if !slices.Contains(cfg.Catalogue.Operator.Consumers, cfg.Consumer) {
			return res, fmt.Errorf("%w: %s does not carry out operator actions, so it can only be replayed whole (without --trip and --type)", ErrInvalid, cfg.Consumer)
		}
		if cfg.Operator == "" || cfg.Reason == "" {
			return res, fmt.Errorf("%w: a filtered replay is an operator action: say who and why", ErrInvalid)
		}
	}
	names := sortedKeys(streams)
	if cfg.Stream != "" {
		names = []string{cfg.Stream}
	}
	start := time.Now()
	// Every stream is checked before any is replayed: a refusal leaves
	// all of them as they were.
	plans := make([]plan, 0, len(names))
	for _, name := range names {
		p, err := prepare(ctx, cfg, name, res.Mode == "reset")
		if err != nil {
			return res, err
		}
		plans = append(plans, p)
	}
	if !slices.ContainsFunc(plans, func(p plan) bool { return !p.sr.NoConsumer }) {
		return res, fmt.Errorf("replay: %s has no durable consumer on %s: start the service (tripsaga up) first", cfg.Consumer, strings.Join(names, ", "))
	}
	bar := NewBar(cfg.Progress, res.Mode+" "+cfg.Consumer)
	for _, p := range plans {
		var sr StreamResult
		var err error
		if res.Mode == "reset" {
			sr, err = reset(ctx, cfg, p, bar)
		} else {
			sr, err = scan(ctx, cfg, p, streams[p.sr.Stream], bar)
		}
		if err != nil {
			return res, err
		}
		res.Streams = append(res.Streams, sr)
		res.Events += sr.Events
	}
	res.Duration = time.Since(start)
	if bar != nil {
		_ = bar.Finish()
	}
	return res, nil
}

func sortedKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// NewBar returns the progress bar every replay shows on w (a count of
// events without a known total, and events/s), or nil when w is nil.
func NewBar(w io.Writer, what string) *progressbar.ProgressBar {
	if w == nil {
		return nil
	}
	return progressbar.NewOptions64(-1, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("events"),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
}

// startSeq is the first sequence of stream to replay: FromSeq, or the
// first stored at or after Since; 0 when there is nothing from there.
func startSeq(ctx context.Context, cfg Config, s jetstream.Stream) (uint64, error) {
	if cfg.FromSeq != 0 {
		return cfg.FromSeq, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &cfg.Since})
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.NumPending == 0 {
		return 0, nil
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		return 0, err
	}
	md, err := m.Metadata()
	if err != nil {
		return 0, err
	}
	return md.Sequence.Stream, nil
}

// plan is one stream's replay as prepare checked it.
type plan struct {
	s jetstream.Stream
	// cons is the durable consumer to reset (reset mode, when it exists).
	cons jetstream.Consumer
	// sr has Stream, To (the stream's last sequence), From (0: nothing
	// stored from there) and NoConsumer set.
	sr StreamResult
}

// prepare reads stream and, in reset mode, the consumer on it, and finds
// where the replay starts (sr.From) and ends (sr.To). It refuses (an error
// wrapping ErrRefused) a FromSeq before the stream's first sequence or
// after its last (a stream that holds nothing is no refusal when FromSeq
// is the next sequence it will store: there is nothing to deliver and
// nothing was skipped), and in reset mode a start the consumer cannot be
// reset to.
func prepare(ctx context.Context, cfg Config, name string, resetMode bool) (plan, error) {
	p := plan{sr: StreamResult{Stream: name}}
	s, err := cfg.JetStream.Stream(ctx, name)
	if err != nil {
		return p, fmt.Errorf("replay: stream %s: %w", name, err)
	}
	p.s = s
	if resetMode {
		cons, err := s.Consumer(ctx, cfg.Consumer)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			p.sr.NoConsumer = true
			return p, nil
		}
		if err != nil {
			return p, fmt.Errorf("replay: consumer %s on %s: %w", cfg.Consumer, name, err)
		}
		p.cons = cons
	}
	st := s.CachedInfo().State
	p.sr.To = st.LastSeq
	if n := cfg.FromSeq; n != 0 {
		switch {
		case st.Msgs == 0 && n == st.LastSeq+1:
			return p, nil // nothing stored, nothing skipped
		case n < st.FirstSeq:
			return p, fmt.Errorf("%w: %s holds #%d..#%d: the events before #%d are no longer in it (purged, aged out, or the stream was made again), so the replay cannot start at #%d",
				ErrRefused, name, st.FirstSeq, st.LastSeq, st.FirstSeq, n)
		case n > st.LastSeq:
			hint := ""
			if cfg.Stream == "" {
				hint = " (a sequence is per stream: give --stream)"
			}
			return p, fmt.Errorf("%w: %s ends at #%d: nothing is stored at #%d%s", ErrRefused, name, st.LastSeq, n, hint)
		}
	}
	from, err := startSeq(ctx, cfg, s)
	if err != nil {
		return p, fmt.Errorf("replay: %s: the point to start from: %w", name, err)
	}
	if from == 0 || from > st.LastSeq {
		return p, nil // nothing stored from there (Since)
	}
	from = max(from, st.FirstSeq)
	if p.cons != nil {
		ci := p.cons.CachedInfo().Config
		switch ci.DeliverPolicy {
		case jetstream.DeliverAllPolicy, jetstream.DeliverByStartTimePolicy: // the server checks a start time's
		case jetstream.DeliverByStartSequencePolicy:
			if from < ci.OptStartSeq {
				return p, fmt.Errorf("%w: the consumer %s on %s starts at #%d (deliver_policy by_start_sequence) and JetStream cannot reset a consumer before its start, so it cannot re-deliver from #%d; replay from #%d, or hand the earlier events over as operator actions (--trip or --type, with --reason)",
					ErrRefused, cfg.Consumer, name, ci.OptStartSeq, from, ci.OptStartSeq)
			}
		default:
			return p, fmt.Errorf("%w: the consumer %s on %s delivers %s and JetStream resets such a consumer only to its ack floor, not to #%d; hand the events over as operator actions (--trip or --type, with --reason)",
				ErrRefused, cfg.Consumer, name, ci.DeliverPolicy, from)
		}
	}
	p.sr.From = from
	return p, nil
}

// reset moves the durable consumer on stream back to the start and waits
// until it has acknowledged every event from there again. The count is the
// server's: the events matching the consumer's filter from the start to
// the stream's end, which the reset makes the consumer deliver.
func reset(ctx context.Context, cfg Config, p plan, bar *progressbar.ProgressBar) (StreamResult, error) {
	sr, name, cons := p.sr, p.sr.Stream, p.cons
	if sr.NoConsumer || sr.From == 0 {
		return sr, nil // or nothing stored from there
	}
	from := sr.From
	r, err := p.s.ResetConsumerToSequence(ctx, cfg.Consumer, from)
	if errors.Is(err, jetstream.ErrConsumerInvalidReset) {
		return sr, fmt.Errorf("%w: the consumer %s on %s cannot be reset to #%d (it starts later); nothing was re-delivered from %s: %v", ErrRefused, cfg.Consumer, name, from, name, err)
	}
	if err != nil {
		return sr, fmt.Errorf("replay: reset %s on %s to %d: %w", cfg.Consumer, name, from, err)
	}
	if r.ResetSeq != from {
		return sr, fmt.Errorf("replay: the server reset %s on %s to #%d, not #%d as asked", cfg.Consumer, name, r.ResetSeq, from)
	}
	total := int64(r.NumPending + uint64(r.NumAckPending))
	sr.Events = int(total)
	if bar != nil {
		bar.ChangeMax64(bar.GetMax64() + total + 1)
		bar.Describe(fmt.Sprintf("reset %s on %s", cfg.Consumer, name))
	}
	var base int64
	if bar != nil {
		base = bar.State().CurrentNum
	}
	for {
		ci, err := cons.Info(ctx)
		if err != nil {
			return sr, fmt.Errorf("replay: consumer %s on %s: %w", cfg.Consumer, name, err)
		}
		left := int64(ci.NumPending) + int64(ci.NumAckPending)
		if bar != nil {
			_ = bar.Set64(base + max(total-left, 0))
		}
		if left == 0 { // every matching event delivered and acknowledged again
			return sr, nil
		}
		select {
		case <-ctx.Done():
			return sr, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// scan reads stream from the start with the consumer's filters and
// either prints (dry run) or hands over (redrive) the matching events.
func scan(ctx context.Context, cfg Config, p plan, filters []string, bar *progressbar.ProgressBar) (StreamResult, error) {
	sr, name, s, from := p.sr, p.sr.Stream, p.s, p.sr.From
	if from == 0 {
		return sr, nil // nothing stored from there
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
	})
	if err != nil {
		return sr, fmt.Errorf("replay: read %s: %w", name, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return sr, fmt.Errorf("replay: read %s: %w", name, err)
	}
	if bar != nil {
		bar.ChangeMax64(bar.GetMax64() + int64(ci.NumPending) + 1)
	}
	for left := ci.NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return sr, fmt.Errorf("replay: read %s: %w", name, err)
		}
		if bar != nil {
			_ = bar.Add(1)
		}
		md, err := m.Metadata()
		if err != nil {
			return sr, err
		}
		if md.Sequence.Stream > sr.To {
			break
		}
		h := m.Headers()
		typ, trip := h.Get("ce-type"), h.Get("ce-subject")
		if cfg.Trip != "" && trip != cfg.Trip || cfg.Type != "" && typ != cfg.Type {
			continue
		}
		sr.Events++
		if cfg.DryRun {
			fmt.Fprintf(cfg.Out, "%s\t%d\t%s\t%s\t%s\t%s\n", name, md.Sequence.Stream, md.Timestamp.UTC().Format(time.RFC3339Nano), dash(typ), dash(trip), dash(h.Get("ce-id")))
			continue
		}
		if err := handOver(ctx, cfg, m, md); err != nil {
			return sr, err
		}
	}
	return sr, nil
}

// handOver publishes the event of m as an operator's redrive to the
// consumer: its service hands it to its inbox, which handles it once.
func handOver(ctx context.Context, cfg Config, m jetstream.Msg, md *jetstream.MsgMetadata) error {
	trip := m.Headers().Get("ce-subject")
	if events.ValidateTripID(trip) != nil {
		trip = "none"
	}
	headers := map[string][]string{}
	for k, v := range m.Headers() {
		if k != jetstream.MsgIDHeader {
			headers[k] = v
		}
	}
	d := events.OperatorActionData{
		Action: events.ActionRedrive, TripID: trip, Service: cfg.Consumer, Reason: cfg.Reason, Operator: cfg.Operator,
		IdempotencyKey: fmt.Sprintf("replay-%s-%s-%d-%d", cfg.Consumer, md.Stream, md.Sequence.Stream, time.Now().UnixNano()),
		DeadLetter: &events.ParkedEvent{Stream: md.Stream, StreamSeq: md.Sequence.Stream, Subject: m.Subject(),
			Consumer: cfg.Consumer, Reason: "replayed by " + cfg.Operator + ": " + cfg.Reason, Headers: headers, Data: m.Data()},
	}
	e, err := events.New(events.Source("reconciler"), events.OperatorAction, trip, d)
	if err != nil {
		return err
	}
	h, err := events.EncodeHeaders(e)
	if err != nil {
		return err
	}
	subject, err := events.Subject(e.Type(), trip)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: subject, Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		msg.Header.Set(k, v)
	}
	if _, err := cfg.JetStream.PublishMsg(ctx, msg, jetstream.WithMsgID(e.ID())); err != nil {
		return fmt.Errorf("replay: hand %s #%d to %s: %w", md.Stream, md.Sequence.Stream, cfg.Consumer, err)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
