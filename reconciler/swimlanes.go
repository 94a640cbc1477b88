package reconciler

import (
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/saga"
)

// Swimlane geometry, in SVG user units (px at 100 %).
const (
	swimW      = 960 // the whole drawing's width
	swimLeft   = 96  // the lanes' labels, left of the plot
	swimRight  = 130 // room right of the plot for a step's "×N attempts · undo ×M"
	swimTop    = 30  // the start's label above the lanes
	swimDotRow = 14  // each lane's row of events and incident markers
	swimRowH   = 16  // one step's row in its lane
	swimBarH   = 10  // a bar's height
	swimPad    = 6   // below each lane
	swimAxis   = 26  // the ticks' labels below the lanes
	swimMinBar = 2   // the narrowest bar: a step that started and finished at once
)

// registerSwimlanes mounts the trip's swimlanes on mux:
//
//	GET /trips/{trip_id}/swimlanes.svg  image/svg+xml: [renderSwimlanes] of the trip's [Timeline]
//
// The trip page shows the same drawing above its timeline table. An id
// that cannot be a trip is 404 problem+json; a trip nothing knows of is
// 404 with an SVG that says so.
func (r *Reconciler) registerSwimlanes(mux *http.ServeMux) {
	mux.HandleFunc("GET /trips/{trip_id}/swimlanes.svg", r.serveSwimlanes)
}

func (r *Reconciler) serveSwimlanes(w http.ResponseWriter, req *http.Request) {
	trip := req.PathValue("trip_id")
	if events.ValidateTripID(trip) != nil {
		process.WriteNotFound(w, req, "Trip not found: not a trip id")
		return
	}
	t, err := r.Timeline(req.Context(), trip)
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: swimlanes "+trip, err)
		return
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if t.unknown() {
		w.WriteHeader(http.StatusNotFound)
	}
	_, _ = w.Write([]byte(renderSwimlanes(t)))
}

// swimBar is one bar of a lane: a step going forward (kind "step") or
// its undo (kind "undo"), from From to To. Open is true when it has not
// ended: To is then the timeline's At, and the bar is hatched.
type swimBar struct {
	Kind     string
	Step     string
	From, To time.Time
	Open     bool
	Status   string
	Attempts int
	Title    string
}

// swimLane is one service's lane: its steps (one row each, in the order
// they were created) with their bars.
type swimLane struct {
	Service string
	Steps   []string
	Bars    []swimBar
}

// renderSwimlanes draws t as an SVG, server-side (no script): one lane
// per service in t.Columns' order (trips, the steps' services in saga
// order, the others, operator and deadletter when they have entries);
// in each, a bar per step log row from its creation to its finish (a
// step still going forward runs to t.At, hatched), its undo as a second,
// dashed bar from the finish (the creation, for a step undone without an
// answer) to its undo (to t.At, hatched, while the undo is not done:
// the step log does not say when the undo was asked), "×N" beside a bar
// called more than once, a red marker at each incident's raised_at, and
// a dot per event, parked copy and operator's record at its time. Each
// mark's <title> says what it is (a tooltip). Times run left to right,
// linearly, from the first known time to the last (t.At when a bar is
// open); the axis is labelled relative to the first, whose UTC time is
// written above the lanes.
//
// Every string from the trip (names, kinds, errors) is escaped and its
// invisible characters written out ([events.Visible]). The element ids
// and classes are stable for tests and styling: <svg id="swimlanes">,
// <rect class="bar step" data-service=".." data-step="..">, class "bar
// undo" for undo bars, "incident" for incident markers, "event",
// "deadletter" and "operator" for dots. A timeline with no entries and
// no steps is an SVG saying "no steps yet".
func renderSwimlanes(t Timeline) template.HTML {
	lanes := swimLanes(t)
	var b strings.Builder
	first, last, ok := swimSpan(t, lanes)
	if !ok {
		fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" id="swimlanes" width="%d" height="40" viewBox="0 0 %d 40" role="img" aria-label="the trip's steps by service" font-family="system-ui,sans-serif" font-size="11">`, swimW, swimW)
		b.WriteString(`<text x="8" y="24" fill="#777" class="empty">no steps yet: nothing of this trip was read</text></svg>`)
		return template.HTML(b.String()) //nolint:gosec // built here from constants
	}
	span := last.Sub(first)
	plotW := float64(swimW - swimLeft - swimRight)
	x := func(at time.Time) float64 {
		if span <= 0 {
			return swimLeft
		}
		return swimLeft + plotW*float64(at.Sub(first))/float64(span)
	}
	tops := make([]float64, len(lanes))
	h := float64(swimTop)
	for i, l := range lanes {
		tops[i] = h
		h += swimDotRow + float64(max(len(l.Steps), 1))*swimRowH + swimPad
	}
	lanesEnd := h
	h += swimAxis
	if len(t.Steps) == 0 {
		h += 12 // the line saying so
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" id="swimlanes" width="%d" height="%.0f" viewBox="0 0 %d %.0f" role="img" aria-label="the trip's steps by service" font-family="system-ui,sans-serif" font-size="11">`,
		swimW, h, swimW, h)
	b.WriteString(`<defs>` +
		`<pattern id="swim-open-step" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)"><rect width="6" height="6" fill="#d6e6f8"/><rect width="3" height="6" fill="#2b7bd6"/></pattern>` +
		`<pattern id="swim-open-undo" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)"><rect width="6" height="6" fill="#f1e6fb"/><rect width="3" height="6" fill="#7a3db8"/></pattern>` +
		`</defs>`)
	fmt.Fprintf(&b, `<text x="%d" y="14" class="start">start %s UTC</text>`, swimLeft, first.UTC().Format("2006-01-02 15:04:05.000"))
	fmt.Fprintf(&b, `<text x="%.0f" y="14" text-anchor="end" fill="#555">%s shown</text>`, swimLeft+plotW, escSwim(swimDuration(span)))
	b.WriteString(`<text class="legend" x="330" y="14" fill="#555"><tspan fill="#2b7bd6">■</tspan> step <tspan fill="#c75000">■</tspan> rejected ` +
		`<tspan fill="#7a3db8">▭</tspan> undo (dashed) <tspan fill="#2b7bd6">▨</tspan> not finished <tspan fill="#b00020">▼</tspan> incident <tspan fill="#0b5cad">●</tspan> event</text>`)

	// Lanes and grid.
	for i, l := range lanes {
		lh := swimDotRow + float64(max(len(l.Steps), 1))*swimRowH
		fill := "#fafafa"
		if i%2 == 1 {
			fill = "#f3f3f3"
		}
		fmt.Fprintf(&b, `<g class="lane" data-service="%s"><rect x="0" y="%.0f" width="%.0f" height="%.0f" fill="%s"/>`,
			escSwim(l.Service), tops[i], swimLeft+plotW, lh+swimPad/2, fill)
		fmt.Fprintf(&b, `<text x="6" y="%.0f" font-weight="bold">%s</text></g>`, tops[i]+swimDotRow+4, escSwim(l.Service))
	}
	step := swimTick(span)
	for d := time.Duration(0); d <= span; d += step {
		tx := x(first.Add(d))
		fmt.Fprintf(&b, `<line class="tick" x1="%.1f" x2="%.1f" y1="%d" y2="%.0f" stroke="#ddd"/>`, tx, tx, swimTop, lanesEnd)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, tx, lanesEnd+14, escSwim(swimTickLabel(d, step)))
	}

	// Bars.
	for i, l := range lanes {
		for _, bar := range l.Bars {
			y := tops[i] + swimDotRow + float64(slices.Index(l.Steps, bar.Step))*swimRowH + (swimRowH-swimBarH)/2
			x0 := x(bar.From)
			w := max(x(bar.To)-x0, swimMinBar)
			class, style := "bar "+bar.Kind, `fill="`+swimFill(bar)+`"`
			if bar.Kind == "undo" {
				style += ` stroke="#7a3db8" stroke-dasharray="3 2"`
			}
			if bar.Open {
				class += " open"
				style = `fill="url(#swim-open-` + bar.Kind + `)"`
			}
			fmt.Fprintf(&b, `<rect class="%s" data-service="%s" data-step="%s" data-status="%s" x="%.1f" y="%.0f" width="%.1f" height="%d" %s><title>%s</title></rect>`,
				class, escSwim(l.Service), escSwim(bar.Step), escSwim(bar.Status), x0, y, w, swimBarH, style, escSwim(bar.Title))
		}
		// Retries, after the step's last bar: "×3 attempts · undo ×4".
		for row, st := range l.Steps {
			var parts []string
			end := 0.0
			for _, bar := range l.Bars {
				if bar.Step != st {
					continue
				}
				end = max(end, x(bar.From)+swimMinBar, x(bar.To))
				switch {
				case bar.Attempts <= 1:
				case bar.Kind == "undo":
					parts = append(parts, fmt.Sprintf("undo ×%d", bar.Attempts))
				default:
					parts = append(parts, fmt.Sprintf("×%d attempts", bar.Attempts))
				}
			}
			if len(parts) > 0 {
				y := tops[i] + swimDotRow + float64(row)*swimRowH + (swimRowH+swimBarH)/2 - 1
				fmt.Fprintf(&b, `<text class="attempts" data-step="%s" x="%.1f" y="%.0f" fill="#555" font-size="10">%s</text>`,
					escSwim(st), end+3, y, strings.Join(parts, " · "))
			}
		}
	}

	// Events, parked copies, operators' records, incidents.
	lane := map[string]int{}
	for i, l := range lanes {
		lane[l.Service] = i
	}
	for _, e := range t.Entries {
		i, ok := lane[e.Column]
		if !ok {
			continue
		}
		class, fill := "", ""
		switch e.Source {
		case "event":
			class, fill = "event", "#0b5cad"
		case "deadletter":
			class, fill = "deadletter", "#8a2be2"
		case "operator":
			class, fill = "operator", "#0b7a75"
		default: // steps and incidents are drawn from their rows
			continue
		}
		title := e.What + " at " + e.At.UTC().Format("15:04:05.000")
		if e.Detail != "" {
			title += ": " + e.Detail
		}
		fmt.Fprintf(&b, `<circle class="%s" cx="%.1f" cy="%.0f" r="3" fill="%s"><title>%s</title></circle>`,
			class, x(e.At), tops[i]+swimDotRow/2, fill, escSwim(title))
	}
	for _, in := range t.Incidents {
		svc := swimIncidentLane(t, in)
		i, ok := lane[svc]
		if !ok {
			continue
		}
		mx, my := x(in.RaisedAt), tops[i]+swimDotRow/2
		state := "open"
		if in.ResolvedAt != nil {
			state = "resolved at " + in.ResolvedAt.UTC().Format("15:04:05.000") + " by " + cmp.Or(in.ResolvedBy, "its step")
		}
		title := fmt.Sprintf("incident %s at %s, step %s, raised %s after %d attempt(s), %s; last error: %s",
			in.Kind, svc, in.Step, in.RaisedAt.UTC().Format("15:04:05.000"), in.Attempts, state, in.LastError)
		fmt.Fprintf(&b, `<path class="incident" data-service="%s" data-step="%s" data-kind="%s" d="M%.1f %.1f l-5 -6 h10 z" fill="#b00020"><title>%s</title></path>`,
			escSwim(svc), escSwim(in.Step), escSwim(in.Kind), mx, my+4, escSwim(title))
	}
	if len(t.Steps) == 0 {
		fmt.Fprintf(&b, `<text class="no-steps" x="%d" y="%.0f" fill="#777">no step log rows: events only</text>`, swimLeft, lanesEnd+swimAxis+8)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here from numbers and escaped text
}

// escSwim escapes s for SVG text and attribute values, its invisible
// characters written out.
func escSwim(s string) string { return template.HTMLEscapeString(events.Visible(s)) }

// swimLanes places t's step log rows in their services' lanes: one lane
// per column of t, then one per column of an entry, a step or an
// incident that t.Columns does not name (a [Timeline] built by hand).
func swimLanes(t Timeline) []swimLane {
	lanes := make([]swimLane, 0, len(t.Columns))
	index := map[string]int{}
	for _, c := range t.Columns {
		index[c] = len(lanes)
		lanes = append(lanes, swimLane{Service: c})
	}
	for _, e := range t.Entries { // a constructed timeline may not name them all
		if _, ok := index[e.Column]; !ok && e.Column != "" {
			index[e.Column] = len(lanes)
			lanes = append(lanes, swimLane{Service: e.Column})
		}
	}
	for _, s := range t.Steps {
		svc := swimStepLane(t, s)
		i, ok := index[svc]
		if !ok {
			i = len(lanes)
			index[svc] = i
			lanes = append(lanes, swimLane{Service: svc})
		}
		l := &lanes[i]
		if !slices.Contains(l.Steps, s.Step) {
			l.Steps = append(l.Steps, s.Step)
		}
		l.Bars = append(l.Bars, swimBars(s, t.At)...)
	}
	for _, in := range t.Incidents {
		if svc := swimIncidentLane(t, in); !slices.ContainsFunc(lanes, func(l swimLane) bool { return l.Service == svc }) {
			lanes = append(lanes, swimLane{Service: svc})
		}
	}
	return lanes
}

// swimStepLane is the service whose step log holds s: the column of the
// entry [stepEntries] made of it ("<step> started" at its creation), else
// the step's own name.
func swimStepLane(t Timeline, s saga.StepView) string {
	for _, e := range t.Entries {
		if e.Source == "step" && e.What == s.Step+" started" && e.At.Equal(s.CreatedAt) {
			return e.Column
		}
	}
	return s.Step
}

// swimIncidentLane is the service that raised in: the column of its
// "incident <kind> raised" entry, else the lane of its step.
func swimIncidentLane(t Timeline, in saga.Incident) string {
	for _, e := range t.Entries {
		if e.Source == "incident" && e.What == "incident "+in.Kind+" raised" && e.At.Equal(in.RaisedAt) {
			return e.Column
		}
	}
	for _, s := range t.Steps {
		if s.Step == in.Step {
			return swimStepLane(t, s)
		}
	}
	return in.Step
}

// swimBars returns the bars of step log row s, at is the timeline's
// time (the end of an open bar).
func swimBars(s saga.StepView, at time.Time) []swimBar {
	const clock = "15:04:05.000"
	created := s.CreatedAt.UTC()
	undoPending := s.UndoneAt == nil && (s.Status == string(saga.Compensating) || s.UndoAttempts > 0)
	fwd := swimBar{Kind: "step", Step: s.Step, From: created, Status: s.Status, Attempts: s.Attempts}
	switch {
	case s.FinishedAt != nil:
		fwd.To = s.FinishedAt.UTC()
		fwd.Title = fmt.Sprintf("%s: %s, %d attempt(s), %s → %s (%s)", s.Step, s.Status, s.Attempts,
			created.Format(clock), fwd.To.Format(clock), swimDuration(fwd.To.Sub(created)))
		if s.Outcome != "" {
			fwd.Title += "; last answer " + s.Outcome
		}
		if s.Reason != "" {
			fwd.Title += "; reason " + s.Reason
		}
	case s.UndoneAt != nil || undoPending:
		// Undone without an answer (failed at its deadline, or voided):
		// the forward call's end is not in the step log.
		fwd.To = created
		fwd.Title = fmt.Sprintf("%s: %s, %d attempt(s) from %s, no answer", s.Step, s.Status, s.Attempts, created.Format(clock))
	default:
		fwd.To, fwd.Open = latest(at.UTC(), created), true
		fwd.Title = fmt.Sprintf("%s: %s, %d attempt(s) since %s, not finished at %s", s.Step, s.Status, s.Attempts,
			created.Format(clock), at.UTC().Format(clock))
	}
	if s.LastError != "" && s.UndoAttempts == 0 {
		fwd.Title += "; last error: " + s.LastError
	}
	bars := []swimBar{fwd}
	if s.UndoneAt == nil && !undoPending {
		return bars
	}
	undo := swimBar{Kind: "undo", Step: s.Step, From: fwd.To, Status: s.Status, Attempts: s.UndoAttempts}
	cause := cmp.Or(s.UndoCause, "?")
	if s.UndoneAt != nil {
		undo.To = latest(s.UndoneAt.UTC(), undo.From)
		undo.Title = fmt.Sprintf("undo of %s (cause %s): %s at %s after %d undo attempt(s)", s.Step, cause, s.Status,
			undo.To.Format(clock), s.UndoAttempts)
	} else {
		undo.To, undo.Open = latest(at.UTC(), undo.From), true
		undo.Title = fmt.Sprintf("undo of %s (cause %s): not done at %s, %d undo attempt(s)", s.Step, cause,
			at.UTC().Format(clock), s.UndoAttempts)
	}
	if s.LastError != "" && s.UndoAttempts > 0 {
		undo.Title += "; last error: " + s.LastError
	}
	return append(bars, undo)
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// swimSpan is the first and last time the drawing shows: of the entries,
// the bars and the incidents. ok is false when there is nothing to draw.
func swimSpan(t Timeline, lanes []swimLane) (first, last time.Time, ok bool) {
	see := func(at time.Time) {
		if at.IsZero() {
			return
		}
		if !ok || at.Before(first) {
			first = at
		}
		if !ok || at.After(last) {
			last = at
		}
		ok = true
	}
	for _, e := range t.Entries {
		see(e.At)
	}
	for _, l := range lanes {
		for _, bar := range l.Bars {
			see(bar.From)
			see(bar.To)
		}
	}
	for _, in := range t.Incidents {
		see(in.RaisedAt)
		if in.ResolvedAt != nil {
			see(*in.ResolvedAt)
		}
	}
	return first.UTC(), last.UTC(), ok
}

// swimTicks are the axis' tick intervals: whole numbers of the unit
// [swimTickLabel] writes them in.
var swimTicks = []time.Duration{ //nolint:gochecknoglobals // read-only
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// swimTick is the interval between the axis' ticks for a drawing of span:
// the shortest that gives at most 6 intervals (days, rounded up to 1, 2
// or 5 times a power of ten, past a few days).
func swimTick(span time.Duration) time.Duration {
	for _, d := range swimTicks {
		if span <= 6*d {
			return d
		}
	}
	const day = 24 * time.Hour
	return time.Duration(niceCeil(float64(span)/float64(6*day))) * day
}

// swimTickLabel writes d, a multiple of step, relative to the start in
// step's unit: "+200ms", "+15s", "+2min", "+6h", "+2d".
func swimTickLabel(d, step time.Duration) string {
	if d == 0 {
		return "0"
	}
	switch {
	case step < time.Second:
		return fmt.Sprintf("+%dms", d.Milliseconds())
	case step < time.Minute:
		return "+" + trimNum(d.Seconds()) + "s"
	case step < time.Hour:
		return "+" + trimNum(d.Minutes()) + "min"
	case step < 24*time.Hour:
		return "+" + trimNum(d.Hours()) + "h"
	}
	return "+" + trimNum(d.Hours()/24) + "d"
}

// swimDuration writes d rounded to what a person reads: ms below a
// minute, then seconds.
func swimDuration(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// swimFill is the colour of a bar that has ended: blue for a step that
// went forward, orange for one the company rejected, red for one that
// failed, pale purple for an undo.
func swimFill(b swimBar) string {
	if b.Kind == "undo" {
		return "#e4d2f5"
	}
	switch saga.Status(b.Status) {
	case saga.Rejected:
		return "#c75000"
	case saga.Failed:
		return "#b00020"
	}
	return "#2b7bd6"
}
