package reconciler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// ServiceURLsEnv names the environment variable that gives the reconciler
// process the base URLs of the services' operator endpoints (GET
// /steps/{trip_id}, GET /incidents, and the trips service's GET /ops/trips),
// as name=url pairs separated by commas:
// "trips=http://127.0.0.1:7405,hotel=http://127.0.0.1:7402". `tripsaga up`
// sets it. Without it timelines have no step rows and no incidents, and
// say so.
const ServiceURLsEnv = "SERVICE_URLS"

// ParseServiceURLs reads the value of [ServiceURLsEnv]. An empty value is
// no services. An error names the pair that is not name=http(s)://host.
func ParseServiceURLs(s string) (map[string]string, error) {
	out := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, raw, ok := strings.Cut(pair, "=")
		u, err := url.Parse(raw)
		if !ok || name == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: %s: %q is not name=http://host:port", ErrInvalidConfig, ServiceURLsEnv, pair)
		}
		out[name] = strings.TrimRight(raw, "/")
	}
	return out, nil
}

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
	Company  string          `json:"company"`
	Step     string          `json:"step"`
	Key      string          `json:"key"`
	Record   provider.Record `json:"record,omitempty"`
	Error    string          `json:"error,omitempty"`
	Resource string          `json:"resource"`
}

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
	t.Columns = timelineColumns(t.Entries, mapKeys(r.cfg.Services))
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
// saga order, then any other service by name, then deadletter.
func timelineColumns(es []Entry, services []string) []string {
	order := []string{"trips"}
	for _, s := range events.Selected().Steps {
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

// streamEntries reads the events about trip on stream: their subjects are
// "<kind>.<trip>" (events.Subject), so the stream's next-message-by-subject
// look-up finds them without a consumer, for kinds of one to three tokens.
// A stream that does not exist has no entries.
func (r *Reconciler) streamEntries(ctx context.Context, name, trip string) ([]Entry, error) {
	s, err := r.cfg.JetStream.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, filter := range []string{"*." + trip, "*.*." + trip, "*.*.*." + trip} {
		for seq := uint64(1); len(out) < timelineMaxEvents; {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return out, err
			}
			out = append(out, eventEntry(name, m))
			seq = m.Sequence + 1
		}
	}
	return out, nil
}

// eventEntry describes one stored event.
func eventEntry(stream string, m *jetstream.RawStreamMsg) Entry {
	en := Entry{At: m.Time.UTC(), Source: "event", Stream: stream, Seq: m.Sequence, What: m.Subject, Column: strings.ToLower(stream)}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil {
		en.Detail = "cannot be decoded: " + err.Error()
		return en
	}
	en.Type, en.ID = e.Type(), e.ID()
	if k := events.Kind(e.Type()); k != "" {
		en.What = k
	}
	if !e.Time().IsZero() {
		en.At = e.Time().UTC()
	}
	en.Column = eventColumn(e.Type(), e.Source(), en.Column)
	// Card tokens and emails are masked in every read view (redact.JSON).
	if json.Valid(e.Data()) {
		en.Data = json.RawMessage(redact.JSON(e.Data()))
	}
	en.Detail = redact.Text(summarise(e.Data()))
	return en
}

// eventColumn is "operator" for an operator's action, else the service
// that publishes typ: its declaration in the
// catalogue, else the last part of its CloudEvents source
// ("/tripsaga/operator"), else fallback.
func eventColumn(typ, source, fallback string) string {
	if typ == events.OperatorAction {
		return "operator" // published by the reconciler's API for a person
	}
	if et, ok := events.Selected().Lookup(typ); ok {
		return et.Service
	}
	if i := strings.LastIndex(source, "/"); i >= 0 && i < len(source)-1 {
		return source[i+1:]
	}
	return fallback
}

// maskRecord returns a company's record with its card tokens and emails
// masked (redact.JSON), for the read views.
func maskRecord(rec provider.Record) provider.Record {
	b, err := json.Marshal(rec)
	if err != nil {
		return rec
	}
	var out provider.Record
	if json.Unmarshal(redact.JSON(b), &out) != nil {
		return rec
	}
	return out
}

// summarise picks the words an operator reads first out of an event's
// data: the reason, the company record, the status; and for an event no
// step publishes (an operator's action, say) who did what and why.
func summarise(data []byte) string {
	var m map[string]any
	if json.Unmarshal(data, &m) != nil {
		return ""
	}
	var parts []string
	for _, k := range []string{"status", "action", "operator", "company_ref", "reason", "service", "incident", "deadletter_seq", "error"} {
		v, ok := m[k]
		if !ok || v == nil || v == "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %v", strings.ReplaceAll(k, "_", " "), v))
	}
	return strings.Join(parts, "; ")
}

// deadLetterEntries scans DEADLETTER for copies of events about trip
// (their original subject "<kind>.<trip>" or their ce-subject).
func (r *Reconciler) deadLetterEntries(ctx context.Context, trip string) ([]Entry, error) {
	s, err := r.cfg.JetStream.Stream(ctx, events.StreamDeadLetter)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for seq, n := uint64(1), 0; n < deadLetterScanMax; n++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(events.DeadLetterSubjectPrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, err
		}
		seq = m.Sequence + 1
		orig := m.Header.Get(outbox.HeaderDeadSubject)
		if !strings.HasSuffix(orig, "."+trip) && m.Header.Get("ce-subject") != trip {
			continue
		}
		en := Entry{At: m.Time.UTC(), Column: "deadletter", Source: "deadletter", Stream: events.StreamDeadLetter, Seq: m.Sequence,
			What:    "parked by " + m.Header.Get(outbox.HeaderDeadConsumer),
			Detail:  fmt.Sprintf("%s #%s (%s): %s", m.Header.Get(outbox.HeaderDeadStream), m.Header.Get(outbox.HeaderDeadSeq), orig, m.Header.Get(outbox.HeaderDeadReason)),
			Headers: map[string]string{}}
		for k := range m.Header {
			en.Headers[k] = m.Header.Get(k)
		}
		if e, err := events.Decode(m.Header, m.Data); err == nil {
			en.Type, en.ID = e.Type(), e.ID()
		}
		if json.Valid(m.Data) {
			en.Data = json.RawMessage(redact.JSON(m.Data))
		}
		out = append(out, en)
	}
	return out, nil
}

// stepEntries turns a service's step rows and incidents into entries.
func stepEntries(service string, steps []saga.StepView, incs []saga.Incident) []Entry {
	var out []Entry
	for _, s := range steps {
		out = append(out, Entry{At: s.CreatedAt.UTC(), Column: service, Source: "step", What: s.Step + " started",
			Detail: "key " + s.IdempotencyKey})
		if s.FinishedAt != nil {
			// Outcome is the company's last answer, an undo's once
			// there was one: the detail says so.
			d := fmt.Sprintf("%d attempt(s)", s.Attempts)
			if s.Outcome != "" {
				d += "; last answer " + s.Outcome
			}
			if s.CompanyRef != "" {
				d += "; company record " + s.CompanyRef
			}
			if s.Reason != "" {
				d += "; reason " + s.Reason
			}
			out = append(out, Entry{At: s.FinishedAt.UTC(), Column: service, Source: "step", What: s.Step + " finished", Detail: d})
		}
		if s.UndoneAt != nil {
			out = append(out, Entry{At: s.UndoneAt.UTC(), Column: service, Source: "step", What: s.Step + " undone",
				Detail: fmt.Sprintf("cause %s; %d undo attempt(s)", cmp.Or(s.UndoCause, "?"), s.UndoAttempts)})
		} else if s.UndoAttempts > 0 {
			out = append(out, Entry{At: time.Now().UTC(), Column: service, Source: "step", What: s.Step + " undo not done yet",
				Detail: fmt.Sprintf("status %s; %d undo attempt(s); last error: %s", s.Status, s.UndoAttempts, s.LastError)})
		}
	}
	for _, in := range incs {
		out = append(out, Entry{At: in.RaisedAt.UTC(), Column: service, Source: "incident", What: "incident " + in.Kind + " raised",
			Detail: fmt.Sprintf("step %s; %d attempt(s); last error: %s", in.Step, in.Attempts, in.LastError)})
		if in.ResolvedAt != nil {
			out = append(out, Entry{At: in.ResolvedAt.UTC(), Column: service, Source: "incident", What: "incident " + in.Kind + " resolved",
				Detail: "step " + in.Step})
		}
	}
	return out
}

// companyStep names the step that calls each company ([provider.Client]
// Company), where it is not the company's own name.
var companyStep = map[string]string{"payments": "payment", "cars": "car", "insurer": "insurance"} //nolint:gochecknoglobals // read-only

// companyRecords reads each company's record of the trip, by the
// Idempotency-Key of the step's log row; without a row there is no key to
// ask by.
func (r *Reconciler) companyRecords(ctx context.Context, trip string, steps []saga.StepView) []CompanyRecord {
	type company struct {
		step string
		c    *provider.Client
	}
	var companies []company
	for _, c := range r.clients() { // the insurer's too with the insurance step on
		companies = append(companies, company{cmp.Or(companyStep[c.Company], c.Company), c})
	}
	out := make([]CompanyRecord, len(companies))
	var wg sync.WaitGroup
	for i, co := range companies {
		key := ""
		for _, s := range steps {
			if s.Step == co.step && s.IdempotencyKey != "" {
				key = s.IdempotencyKey
			}
		}
		out[i] = CompanyRecord{Company: co.c.Company, Step: co.step, Key: key, Resource: co.c.Resource}
		if key == "" {
			continue // the step never started, or its log was not read (Unread says so)
		}
		wg.Go(func() {
			var rec provider.Record
			err := getJSON(ctx, co.c.BaseURL+"/"+co.c.Resource+"/"+url.PathEscape(key), &rec)
			var nf *notFoundError
			switch {
			case errors.As(err, &nf):
			case err != nil:
				out[i].Error = err.Error()
			default:
				out[i].Record = maskRecord(rec)
			}
		})
	}
	wg.Wait()
	return out
}

// stoppedAt says where the trip is, in one sentence.
func stoppedAt(t Timeline) string {
	if t.View == nil && len(t.Entries) == 0 {
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
		last := ""
		for _, e := range t.Entries {
			if e.Source == "event" {
				last = e.What
			}
		}
		fmt.Fprintf(&b, "%s, not settled: the newest event is %s, %s ago", t.View.Status, cmp.Or(last, "?"),
			t.At.Sub(t.View.LastEventAt).Round(time.Second))
	}
	for _, in := range t.Incidents {
		if in.ResolvedAt == nil {
			fmt.Fprintf(&b, "; open incident at %s: %s after %d attempt(s) (%s)", in.Step, in.Kind, in.Attempts, in.LastError)
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

// ServiceIncident is an incident with the service that raised it.
type ServiceIncident struct {
	Service string `json:"service"`
	saga.Incident
}

// serviceIncidents reads GET <base>/incidents.
func (r *Reconciler) serviceIncidents(ctx context.Context, name, base string) ([]ServiceIncident, error) {
	var body struct {
		Items []saga.Incident `json:"items"`
	}
	if err := getJSON(ctx, base+"/incidents", &body); err != nil {
		return nil, err
	}
	out := make([]ServiceIncident, 0, len(body.Items))
	for _, in := range body.Items {
		out = append(out, ServiceIncident{Service: name, Incident: in})
	}
	return out, nil
}

// Incidents gathers the incidents of every service ([Config.Services]),
// open ones first then by age, oldest first; unread names the services
// that did not answer.
func (r *Reconciler) Incidents(ctx context.Context) (items []ServiceIncident, unread []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	items = []ServiceIncident{}
	for name, base := range r.cfg.Services {
		wg.Go(func() {
			got, err := r.serviceIncidents(ctx, name, base)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unread = append(unread, fmt.Sprintf("%s: %v", name, err))
				return
			}
			items = append(items, got...)
		})
	}
	wg.Wait()
	if len(r.cfg.Services) == 0 {
		unread = append(unread, "the services' URLs are not known ("+ServiceURLsEnv+")")
	}
	slices.SortFunc(items, func(a, b ServiceIncident) int {
		return cmp.Or(cmp.Compare(boolInt(a.ResolvedAt != nil), boolInt(b.ResolvedAt != nil)), a.RaisedAt.Compare(b.RaisedAt))
	})
	sort.Strings(unread)
	return items, unread
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SearchHit is a trip [Reconciler.Search] found and what matched: "trip
// id", "Idempotency-Key", "traveler email", "step key" or "company
// record".
type SearchHit struct {
	TripID  string `json:"trip_id"`
	Matched string `json:"matched"`
}

// Search finds the trips q names: a trip id the projection knows, a step's
// Idempotency-Key ("<trip>:hotel"), a trip request's Idempotency-Key or a
// traveler's email (asked of the trips service's GET /ops/trips), or,
// when none of those matched, a company record id or key (hold_id,
// charge_id, booking_id: the companies' lists are read). Each trip is
// listed once, with its first match. Sources that could not be asked are in unread.
func (r *Reconciler) Search(ctx context.Context, q string) (hits []SearchHit, unread []string) {
	q = strings.TrimSpace(q)
	hits = []SearchHit{}
	if q == "" {
		return hits, nil
	}
	seen := map[string]bool{}
	hit := func(trip, matched string) {
		if !seen[trip] {
			seen[trip] = true
			hits = append(hits, SearchHit{trip, matched})
		}
	}
	known := func(trip string) bool {
		if events.ValidateTripID(trip) != nil {
			return false
		}
		_, err := r.View(ctx, trip)
		return err == nil
	}
	if known(q) {
		hit(q, "trip id")
	}
	if i := strings.LastIndex(q, ":"); i > 0 && known(q[:i]) {
		hit(q[:i], "step key")
	}
	if base, ok := r.cfg.Services["trips"]; ok {
		var body struct {
			Items []struct {
				TripID  string `json:"trip_id"`
				Matched string `json:"matched"`
			} `json:"items"`
		}
		if err := getJSON(ctx, base+"/ops/trips?q="+url.QueryEscape(q), &body); err != nil {
			unread = append(unread, "trips: "+err.Error())
		}
		for _, it := range body.Items {
			hit(it.TripID, map[string]string{"email": "traveler email", "idempotency_key": "Idempotency-Key"}[it.Matched])
		}
	} else {
		unread = append(unread, "trips: its URL is not known ("+ServiceURLsEnv+"), so no Idempotency-Key or email search")
	}
	if len(hits) > 0 {
		return hits, unread // the companies' lists are long: read them only when nothing else matched
	}
	for _, c := range r.clients() {
		recs, err := c.List(ctx, "")
		if err != nil {
			unread = append(unread, c.Company+": "+err.Error())
			continue
		}
		for _, rec := range recs {
			if rec.TripID() == "" {
				continue
			}
			if s, _ := rec[c.IDField].(string); s == q || rec.Key() == q {
				hit(rec.TripID(), "company record")
			}
		}
	}
	return hits, unread
}

// notFoundError is a 404 answer.
type notFoundError struct{ url string }

func (e *notFoundError) Error() string { return "GET " + e.url + ": 404" }

// opsHTTP is the client of the services' and companies' read endpoints.
var opsHTTP = &http.Client{Timeout: 5 * time.Second} //nolint:gochecknoglobals // shared connection pool

// httpGet GETs u; a status other than 200 is an error ([*notFoundError]
// for 404). The caller closes the body.
func httpGet(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json, text/plain")
	resp, err := opsHTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, &notFoundError{u}
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return nil, fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, strings.TrimSpace(string(b)))
}

// getJSON GETs u into v (see [httpGet]).
func getJSON(ctx context.Context, u string, v any) error {
	resp, err := httpGet(ctx, u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 32<<20)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
