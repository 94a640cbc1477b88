package reconciler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// Timeline is everything known about one trip, from every source, as
// [Reconciler.Timeline] gathers it: the events of every stream of
// [events.Default] and the parked copies on DEADLETTER, each service's step
// log rows and incidents (through its HTTP API), the companies' current
// records, the projection's row and the sweep's findings.
type Timeline struct {
	TripID string `json:"trip_id"`
	// At is when the timeline was gathered (UTC).
	At time.Time `json:"at"`
	// View is the projection's row, nil when the reconciler has seen no
	// event of the trip.
	View *TripView `json:"view,omitempty"`
	// Stopped says in a sentence where the trip is: settled, or what it
	// waits for (the newest event, open incidents, dead letters).
	Stopped string `json:"stopped"`
	// Version is the trip's version (events.VersionExtension), the saga
	// order it runs under: its projection row's, else that of the first
	// of its events that carries one, else the default order.
	Version string `json:"version"`
	// Columns are the entries' columns, one per service ("trips",
	// "hotel", ...), then "deadletter" when a copy was parked.
	Columns []string `json:"columns"`
	// Entries are in time order (equal times: events before step rows,
	// then by column).
	Entries   []Entry         `json:"entries"`
	Steps     []saga.StepView `json:"steps"`
	Incidents []saga.Incident `json:"incidents"`
	Records   []CompanyRecord `json:"records"`
	Findings  []Finding       `json:"findings"`
	// Paused names each service where an operator paused the trip's
	// company calls: "payment: paused by ada: <why>".
	Paused []string `json:"paused,omitempty"`
	// Unread names each source that could not be read, with the reason:
	// the timeline is then incomplete, never silently.
	Unread []string `json:"unread,omitempty"`
}

// Entry is one line of a [Timeline].
type Entry struct {
	At time.Time `json:"at"`
	// Column is the service the entry belongs to: an event's publishing
	// service (its catalogue declaration, else its CloudEvents source),
	// the service whose step log or incident it is, or "deadletter".
	Column string `json:"column"`
	// Source is "event", "deadletter", "step", "incident" or "operator"
	// (a service's record of carrying out an operator's action).
	Source string `json:"source"`
	// What is short: the event kind ("hotel.held"), "hotel started",
	// "incident compensation_stuck raised".
	What string `json:"what"`
	// Detail is the rest in words (reason, company record, attempts,
	// last error).
	Detail string `json:"detail,omitempty"`
	// Stream and Seq place an event or a parked copy in JetStream.
	Stream string `json:"stream,omitempty"`
	Seq    uint64 `json:"seq,omitempty"`
	// Type and ID are the CloudEvents type and id of an event.
	Type string `json:"type,omitempty"`
	ID   string `json:"id,omitempty"`
	// Data is an event's data.
	Data json.RawMessage `json:"data,omitempty"`
	// Headers are a parked copy's headers (reason, stream, sequence,
	// consumer, the ce- attributes).
	Headers map[string]string `json:"headers,omitempty"`
}

// CompanyRecord is a company's current record for one step of the trip,
// read at its GET /<resource>/<key> with the key of the step's log row;
// Record is nil when the company has none (404) or Key is empty (no step
// row: the step never started, or its service's log was not read), Error
// says why it could not be read.
type CompanyRecord struct {
	Company string `json:"company"`
	Step    string `json:"step"`
	Key     string `json:"key"`
	// KeyFrom says where Key came from: the step's log row
	// ([KeyFromStepLog]), or, without one, the key the step uses
	// ([KeyFromConvention]).
	KeyFrom string          `json:"key_from"`
	Record  provider.Record `json:"record,omitempty"`
	// None is true when the company answered that it has no record of
	// Key (404); Error says why it could not be read. With neither and
	// no Record, the company was not asked.
	None     bool   `json:"none,omitempty"`
	Error    string `json:"error,omitempty"`
	Resource string `json:"resource"`
}

// Where a [CompanyRecord]'s key came from.
const (
	KeyFromStepLog    = "step log"
	KeyFromConvention = "convention"
)

// timelineMaxEvents bounds the events read per stream for one trip.
const timelineMaxEvents = 1000

// deadLetterScanMax bounds the parked copies scanned for one timeline.
const deadLetterScanMax = 10000

// Timeline gathers the timeline of trip. Sources that cannot be read are
// named in [Timeline.Unread]; only an invalid trip id is an error
// (wrapping [events.ErrInvalidEvent]). A trip nothing knows of has no
// entries and View nil.
func (r *Reconciler) Timeline(ctx context.Context, trip string) (Timeline, error) {
	if err := events.ValidateTripID(trip); err != nil {
		return Timeline{}, err
	}
	t := Timeline{TripID: trip, At: time.Now().UTC(), Entries: []Entry{}, Steps: []saga.StepView{},
		Incidents: []saga.Incident{}, Records: []CompanyRecord{}, Findings: []Finding{}}
	var mu sync.Mutex
	unread := func(format string, args ...any) {
		mu.Lock()
		t.Unread = append(t.Unread, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	add := func(es ...Entry) {
		mu.Lock()
		t.Entries = append(t.Entries, es...)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	// Every version's streams (events.Full): a trip with insurance may be
	// looked at after STEPS turned it off.
	streams := slices.Sorted(maps.Keys(events.Full().StreamSubjects()))
	for _, s := range streams {
		wg.Go(func() {
			es, err := r.streamEntries(ctx, s, trip)
			if err != nil {
				unread("stream %s: %v", s, err)
			}
			add(es...)
		})
	}
	wg.Go(func() {
		es, err := r.deadLetterEntries(ctx, trip)
		if err != nil {
			unread("stream %s: %v", events.StreamDeadLetter, err)
		}
		add(es...)
	})
	if len(r.cfg.Services) == 0 {
		unread("step logs and incidents: the services' URLs are not known (%s)", ServiceURLsEnv)
	}
	for _, name := range slices.Sorted(maps.Keys(r.cfg.Services)) {
		base := r.cfg.Services[name]
		wg.Go(func() {
			var steps struct {
				Items []saga.StepView `json:"items"`
			}
			if err := getJSON(ctx, base+"/steps/"+url.PathEscape(trip), &steps); err != nil {
				unread("%s step log: %v", name, err)
			}
			var incs []saga.Incident
			if all, err := r.serviceIncidents(ctx, name, base); err != nil {
				unread("%s incidents: %v", name, err)
			} else {
				for _, in := range all {
					if in.TripID == trip {
						incs = append(incs, in.Incident)
					}
				}
			}
			var ops operatorLog
			var nf *notFoundError
			if err := getJSON(ctx, base+"/operator/"+url.PathEscape(trip), &ops); err != nil && !errors.As(err, &nf) {
				unread("%s operator log: %v", name, err)
			}
			mu.Lock()
			t.Steps = append(t.Steps, steps.Items...)
			t.Incidents = append(t.Incidents, incs...)
			if ops.Paused {
				t.Paused = append(t.Paused, fmt.Sprintf("%s: paused by %s: %s", name, ops.PausedBy, ops.PauseReason))
			}
			mu.Unlock()
			add(stepEntries(name, steps.Items, incs)...)
			for _, o := range ops.Items {
				add(Entry{At: o.At.UTC(), Column: name, Source: "operator", What: o.Action + " carried out",
					Detail: fmt.Sprintf("%s; asked by %s: %s", o.Effect, o.Operator, o.Reason), ID: o.EventID})
			}
		})
	}
	var view *TripView
	var findings []Finding
	wg.Go(func() {
		v, err := r.View(ctx, trip)
		switch {
		case err == nil:
			view = &v
		case !errors.Is(err, ErrTripNotFound):
			unread("projection: %v", err)
		}
		rows, err := queries.FindingListByTrip(ctx, r.cfg.Pool, trip)
		if err != nil {
			unread("findings: %v", err)
		}
		for _, row := range rows {
			findings = append(findings, findingFromRow(row))
		}
	})
	wg.Wait()
	t.View = view
	if findings != nil {
		t.Findings = findings
	}
	t.Records = r.companyRecords(ctx, trip, t.Steps)
	sortEntries(t.Entries)
	slices.SortFunc(t.Steps, func(a, b saga.StepView) int { return a.CreatedAt.Compare(b.CreatedAt) })
	slices.SortFunc(t.Incidents, func(a, b saga.Incident) int { return a.RaisedAt.Compare(b.RaisedAt) })
	slices.Sort(t.Unread)
	slices.Sort(t.Paused)
	t.Columns = timelineColumns(r.cfg.Catalogue, t.Entries, mapKeys(r.cfg.Services))
	t.Stopped = stoppedAt(t)
	t.Version = timelineVersion(t)
	return t, nil
}

// operatorLog is a service's GET /operator/{trip_id}: the operators'
// actions it carried out for the trip, and its pause.
type operatorLog struct {
	Items       []saga.OperatorEntry `json:"items"`
	Paused      bool                 `json:"paused"`
	PausedBy    string               `json:"paused_by"`
	PauseReason string               `json:"pause_reason"`
}

// sortEntries orders entries by time, then events before step rows and
// incidents, then by column and stream position.
func sortEntries(es []Entry) {
	rank := map[string]int{"event": 0, "operator": 1, "step": 2, "incident": 3, "deadletter": 4}
	slices.SortStableFunc(es, func(a, b Entry) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(rank[a.Source], rank[b.Source]),
			cmp.Compare(a.Column, b.Column), cmp.Compare(a.Seq, b.Seq))
	})
}

// timelineVersion is the version of the trip of t: its projection row's
// when it has one, else that of its first event carrying one (the
// ce-tripsteps header), else the default order.
func timelineVersion(t Timeline) string {
	if t.View != nil && t.View.Version != "" {
		return t.View.Version
	}
	for _, e := range t.Entries {
		if v := e.Headers["ce-"+events.VersionExtension]; v != "" {
			return v
		}
	}
	return events.DefaultVersion()
}

// timelineColumns orders the columns: trips, then the steps' services in
// saga order (catalogue c's), then any other service by name, then
// deadletter.
func timelineColumns(c events.Catalogue, es []Entry, services []string) []string {
	order := []string{"trips"}
	for _, s := range c.Steps {
		if !slices.Contains(order, s.Service) {
			order = append(order, s.Service)
		}
	}
	seen := map[string]bool{}
	for _, e := range es {
		seen[e.Column] = true
	}
	for _, s := range services {
		seen[s] = true
	}
	var out []string
	for _, c := range order {
		if seen[c] {
			out = append(out, c)
			delete(seen, c)
		}
	}
	dead := seen["deadletter"]
	delete(seen, "deadletter")
	out = append(out, slices.Sorted(maps.Keys(seen))...)
	if dead {
		out = append(out, "deadletter")
	}
	return out
}

// stoppedAt says where the trip is, in one sentence.
func stoppedAt(t Timeline) string {
	if t.View == nil && len(t.Entries) == 0 {
		for _, f := range t.Findings {
			if f.ResolvedAt == nil {
				return "no event of this trip was seen, but the sweep found it " + f.Kind + ": " + f.Detail
			}
		}
		return "nothing is known of this trip"
	}
	var b strings.Builder
	switch {
	case t.View == nil:
		b.WriteString("the reconciler has no projection of this trip yet")
	case t.View.Settled != "":
		fmt.Fprintf(&b, "settled: %s", t.View.Settled)
		// The event that settled it (trip.<settled>), timed from the
		// request it answers: the booking's, or the traveler's
		// cancellation's for canceled_by_traveler.
		from, what := t.View.FirstEventAt, "the request"
		for _, e := range t.Entries {
			if e.Source != "event" {
				continue
			}
			if e.What == "trip.cancellation_requested" {
				from, what = e.At, "the cancellation"
			}
			if e.What == "trip."+t.View.Settled {
				fmt.Fprintf(&b, " at %s, %s after %s", e.At.Format(time.RFC3339), e.At.Sub(from).Round(time.Millisecond), what)
				break
			}
		}
		if !t.View.Mailed {
			b.WriteString("; the traveler is not mailed yet")
		}
	default:
		// The newest event's name and its own age, from one entry (the
		// entries are in time order); the view's time when none was read.
		last, at := "", t.View.LastEventAt
		for _, e := range t.Entries {
			if e.Source == "event" {
				last, at = e.What, e.At
			}
		}
		fmt.Fprintf(&b, "%s, not settled: the newest event is %s, %s ago", t.View.Status, cmp.Or(last, "?"),
			t.At.Sub(at).Round(time.Second))
	}
	for _, in := range t.Incidents {
		if in.ResolvedAt == nil {
			fmt.Fprintf(&b, "; open incident at %s: %s after %d attempt(s) (%s)", in.Step, in.Kind, in.Calls(), in.LastError)
		}
	}
	for _, p := range t.Paused {
		fmt.Fprintf(&b, "; retries paused at %s", p)
	}
	dead := 0
	for _, e := range t.Entries {
		if e.Source == "deadletter" {
			dead++
		}
	}
	if dead > 0 {
		fmt.Fprintf(&b, "; %d event(s) parked on %s", dead, events.StreamDeadLetter)
	}
	for _, f := range t.Findings {
		if f.ResolvedAt == nil {
			fmt.Fprintf(&b, "; finding %s: %s", f.Kind, f.Detail)
		}
	}
	return b.String()
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
