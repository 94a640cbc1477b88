package reconciler

import (
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga"
)

// svgEl is one element of a drawing, as a test reads it.
type svgEl struct {
	Name  string
	Attr  map[string]string
	Title string // its <title> child's text
}

// num is attribute name of e as a number.
func (e svgEl) num(t *testing.T, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.Attr[name], 64)
	require.NoError(t, err, "%s %s=%q", e.Name, name, e.Attr[name])
	return v
}

// parseSVG reads s as strict XML (so hostile text cannot have broken
// it) and returns its elements in document order.
func parseSVG(t *testing.T, s string) []svgEl {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(s))
	var out []svgEl
	var open []int // indexes into out of the elements not closed yet
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG is well-formed XML:\n%s", s)
		switch tok := tok.(type) {
		case xml.StartElement:
			el := svgEl{Name: tok.Name.Local, Attr: map[string]string{}}
			for _, a := range tok.Attr {
				el.Attr[a.Name.Local] = a.Value
			}
			open = append(open, len(out))
			out = append(out, el)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if n := len(open); n >= 2 && out[open[n-1]].Name == "title" {
				out[open[n-2]].Title += string(tok)
			}
		}
	}
	require.Empty(t, open)
	return out
}

// having returns the elements whose class attribute is class.
func having(els []svgEl, class string) []svgEl {
	var out []svgEl
	for _, e := range els {
		if e.Attr["class"] == class {
			out = append(out, e)
		}
	}
	return out
}

// swimTrip is a trip whose car was rejected: the hotel held (100 ms),
// the card charged on its third attempt, the car rejected, then the
// charge refunded and the hold released, with an incident on the refund
// on the way; it was looked at 1 s after it started.
func swimTrip(t0 time.Time) Timeline {
	at := func(ms int) *time.Time { v := t0.Add(time.Duration(ms) * time.Millisecond); return &v }
	hotel := []saga.StepView{{TripID: "T-swim", Step: "hotel", Status: string(saga.Compensated), Attempts: 1, UndoAttempts: 1,
		UndoCause: saga.CauseCompensation, CreatedAt: t0, FinishedAt: at(100), UndoneAt: at(900)}}
	pay := []saga.StepView{{TripID: "T-swim", Step: "payment", Status: string(saga.Compensated), Attempts: 3, UndoAttempts: 4,
		UndoCause: saga.CauseCompensation, CreatedAt: *at(150), FinishedAt: at(300), UndoneAt: at(800)}}
	car := []saga.StepView{{TripID: "T-swim", Step: "car", Status: string(saga.Rejected), Attempts: 1, Reason: "sold out",
		CreatedAt: *at(350), FinishedAt: at(400)}}
	incs := []saga.Incident{{TripID: "T-swim", Step: "payment", Kind: saga.IncidentCompensationStuck, Attempts: 3,
		LastError: "503 from the card processor", RaisedAt: *at(600), ResolvedAt: at(800)}}
	tl := Timeline{TripID: "T-swim", At: *at(1000), Columns: []string{"trips", "hotel", "payment", "car", "operator"}}
	tl.Entries = append(tl.Entries, Entry{At: t0, Column: "trips", Source: "event", What: "trip.requested"},
		Entry{At: *at(410), Column: "car", Source: "event", What: "car.rejected"},
		Entry{At: *at(700), Column: "operator", Source: "event", What: "operator.action", Detail: "retry_undo by ada"})
	tl.Entries = append(tl.Entries, stepEntries("hotel", hotel, nil)...)
	tl.Entries = append(tl.Entries, stepEntries("payment", pay, incs)...)
	tl.Entries = append(tl.Entries, stepEntries("car", car, nil)...)
	sortEntries(tl.Entries)
	tl.Steps = append(append(append(tl.Steps, hotel...), pay...), car...)
	tl.Incidents = incs
	return tl
}

// The swimlanes of a trip: a lane per column in order, a bar per step
// placed by its times, the undo of a compensated step as its own bar, the
// retries, incidents and events marked.
func TestSwimlanes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 12, 3, 4, 0, time.UTC)

	t.Run("LanesInColumnsOrder", func(t *testing.T) {
		t.Parallel()
		els := parseSVG(t, string(renderSwimlanes(swimTrip(t0))))
		require.Equal(t, "svg", els[0].Name)
		require.Equal(t, "swimlanes", els[0].Attr["id"])
		var lanes []string
		for _, l := range having(els, "lane") {
			lanes = append(lanes, l.Attr["data-service"])
		}
		require.Equal(t, []string{"trips", "hotel", "payment", "car", "operator"}, lanes)
	})

	t.Run("BarsFollowTheTimes", func(t *testing.T) {
		t.Parallel()
		els := parseSVG(t, string(renderSwimlanes(swimTrip(t0))))
		bars := having(els, "bar step")
		require.Len(t, bars, 3)
		byStep := map[string]svgEl{}
		for _, b := range bars {
			require.Equal(t, b.Attr["data-step"], b.Attr["data-service"], "each step in its service's lane")
			byStep[b.Attr["data-step"]] = b
		}
		hotel, pay, car := byStep["hotel"], byStep["payment"], byStep["car"]
		require.Less(t, hotel.num(t, "x"), pay.num(t, "x"))
		require.Less(t, pay.num(t, "x"), car.num(t, "x"))
		require.Less(t, hotel.num(t, "y"), pay.num(t, "y"), "lanes top to bottom in order")
		// 100 ms, 150 ms and 50 ms on one linear scale.
		require.InDelta(t, 1.5, pay.num(t, "width")/hotel.num(t, "width"), 0.05)
		require.InDelta(t, 0.5, car.num(t, "width")/hotel.num(t, "width"), 0.05)
		require.Equal(t, "rejected", car.Attr["data-status"])
		require.Contains(t, car.Title, "sold out")
	})

	t.Run("UndoIsItsOwnBar", func(t *testing.T) {
		t.Parallel()
		els := parseSVG(t, string(renderSwimlanes(swimTrip(t0))))
		undos := having(els, "bar undo")
		require.Len(t, undos, 2, "hotel and payment were undone, the rejected car was not")
		var hotelStep svgEl
		for _, b := range having(els, "bar step") {
			if b.Attr["data-step"] == "hotel" {
				hotelStep = b
			}
		}
		for _, u := range undos {
			if u.Attr["data-step"] != "hotel" {
				continue
			}
			require.InDelta(t, hotelStep.num(t, "x")+hotelStep.num(t, "width"), u.num(t, "x"), 0.2, "from the finish")
			require.InDelta(t, 8, u.num(t, "width")/hotelStep.num(t, "width"), 0.05, "100 ms to 900 ms")
			require.Equal(t, hotelStep.Attr["y"], u.Attr["y"], "on the step's row")
			require.Contains(t, u.Title, "cause compensation")
		}
	})

	t.Run("RetriesMarked", func(t *testing.T) {
		t.Parallel()
		els := parseSVG(t, string(renderSwimlanes(swimTrip(t0))))
		svg := string(renderSwimlanes(swimTrip(t0)))
		marks := having(els, "attempts")
		require.Len(t, marks, 1, "only the card step was called more than once")
		require.Equal(t, "payment", marks[0].Attr["data-step"])
		require.Contains(t, svg, "×3 attempts · undo ×4")
	})

	t.Run("IncidentsAndEventsMarked", func(t *testing.T) {
		t.Parallel()
		els := parseSVG(t, string(renderSwimlanes(swimTrip(t0))))
		incs := having(els, "incident")
		require.Len(t, incs, 1)
		require.Equal(t, "payment", incs[0].Attr["data-service"])
		require.Equal(t, saga.IncidentCompensationStuck, incs[0].Attr["data-kind"])
		require.Contains(t, incs[0].Title, saga.IncidentCompensationStuck)
		require.Contains(t, incs[0].Title, "503 from the card processor")
		dots := having(els, "event")
		require.Len(t, dots, 3, "the events, not the step rows")
		var kinds []string
		for _, d := range dots {
			kinds = append(kinds, strings.Fields(d.Title)[0])
		}
		require.Equal(t, []string{"trip.requested", "car.rejected", "operator.action"}, kinds)
		require.Less(t, dots[0].num(t, "cx"), dots[1].num(t, "cx"))
	})

	t.Run("OpenStepRunsToAt", func(t *testing.T) {
		t.Parallel()
		tl := Timeline{TripID: "T-open", At: t0.Add(2 * time.Second), Columns: []string{"trips", "hotel"}}
		st := []saga.StepView{{Step: "hotel", Status: string(saga.Unknown), Attempts: 2, LastError: "timeout", CreatedAt: t0}}
		tl.Entries = append([]Entry{{At: t0, Column: "trips", Source: "event", What: "trip.requested"}}, stepEntries("hotel", st, nil)...)
		tl.Steps = st
		els := parseSVG(t, string(renderSwimlanes(tl)))
		open := having(els, "bar step open")
		require.Len(t, open, 1)
		require.InDelta(t, swimW-swimRight, open[0].num(t, "x")+open[0].num(t, "width"), 0.2, "to the timeline's At")
		require.Contains(t, open[0].Attr["fill"], "url(#swim-open-step)")
		require.Contains(t, open[0].Title, "timeout")
	})

	t.Run("UndoNotDoneYetIsOpen", func(t *testing.T) {
		t.Parallel()
		done := t0.Add(time.Second)
		st := []saga.StepView{{Step: "payment", Status: string(saga.Compensating), Attempts: 1, UndoAttempts: 5,
			LastError: "refund failed", CreatedAt: t0, FinishedAt: &done}}
		tl := Timeline{TripID: "T-stuck", At: t0.Add(10 * time.Second), Columns: []string{"payment"}, Steps: st,
			Entries: stepEntries("payment", st, nil)}
		els := parseSVG(t, string(renderSwimlanes(tl)))
		open := having(els, "bar undo open")
		require.Len(t, open, 1)
		require.Contains(t, open[0].Title, "not done")
		require.Contains(t, open[0].Title, "refund failed")
	})

	t.Run("FailedStepUndoneWithoutAnAnswer", func(t *testing.T) {
		t.Parallel()
		undone := t0.Add(3 * time.Second)
		st := []saga.StepView{{Step: "car", Status: string(saga.Failed), Attempts: 4, UndoAttempts: 1,
			UndoCause: saga.CauseDeadline, CreatedAt: t0, UndoneAt: &undone}}
		tl := Timeline{TripID: "T-failed", At: t0.Add(4 * time.Second), Columns: []string{"car"}, Steps: st,
			Entries: stepEntries("car", st, nil)}
		els := parseSVG(t, string(renderSwimlanes(tl)))
		step, undo := having(els, "bar step"), having(els, "bar undo")
		require.Len(t, step, 1)
		require.Len(t, undo, 1)
		require.Contains(t, step[0].Title, "no answer")
		require.InDelta(t, step[0].num(t, "x"), undo[0].num(t, "x"), 0.2, "the undo from the creation")
		require.Contains(t, undo[0].Title, "cause deadline")
	})

	t.Run("EqualTimesHaveAMinimumWidth", func(t *testing.T) {
		t.Parallel()
		st := []saga.StepView{{Step: "hotel", Status: string(saga.Done), Attempts: 1, CreatedAt: t0, FinishedAt: &t0}}
		tl := Timeline{TripID: "T-instant", At: t0, Columns: []string{"hotel"}, Steps: st, Entries: stepEntries("hotel", st, nil)}
		els := parseSVG(t, string(renderSwimlanes(tl)))
		bars := having(els, "bar step")
		require.Len(t, bars, 1)
		require.InDelta(t, swimMinBar, bars[0].num(t, "width"), 0.01)
	})

	t.Run("LongTripScales", func(t *testing.T) {
		t.Parallel()
		end := t0.Add(3 * 24 * time.Hour)
		st := []saga.StepView{
			{Step: "hotel", Status: string(saga.Done), Attempts: 1, CreatedAt: t0, FinishedAt: new(t0.Add(time.Millisecond))},
			{Step: "payment", Status: string(saga.Done), Attempts: 1, CreatedAt: end.Add(-time.Hour), FinishedAt: &end},
		}
		tl := Timeline{TripID: "T-long", At: end, Columns: []string{"hotel", "payment"}, Steps: st}
		tl.Entries = append(stepEntries("hotel", st[:1], nil), stepEntries("payment", st[1:], nil)...)
		els := parseSVG(t, string(renderSwimlanes(tl)))
		ticks := having(els, "tick")
		require.GreaterOrEqual(t, len(ticks), 3)
		require.LessOrEqual(t, len(ticks), 7)
		for _, b := range having(els, "bar step") {
			require.LessOrEqual(t, b.num(t, "x")+b.num(t, "width"), float64(swimW-swimRight)+swimMinBar)
		}
		require.Contains(t, string(renderSwimlanes(tl)), "+24h", "the axis in hours")
	})

	t.Run("HostileTextIsEscaped", func(t *testing.T) {
		t.Parallel()
		evil := `<script>alert(1)</script>"&' ` + "\u202e"
		done := t0.Add(time.Second)
		st := []saga.StepView{{Step: evil, Status: evil, Attempts: 1, Outcome: evil, LastError: evil, CreatedAt: t0, FinishedAt: &done}}
		tl := Timeline{TripID: "T-evil", At: done, Columns: []string{"trips", evil}, Steps: st,
			Incidents: []saga.Incident{{Step: evil, Kind: evil, LastError: evil, RaisedAt: done}}}
		tl.Entries = append(stepEntries(evil, st, tl.Incidents), Entry{At: t0, Column: "trips", Source: "event", What: evil, Detail: evil})
		svg := string(renderSwimlanes(tl))
		require.NotContains(t, svg, "<script")
		require.NotContains(t, svg, "\u202e")
		els := parseSVG(t, svg)
		bars := having(els, "bar step")
		require.Len(t, bars, 1)
		visible := events.Visible(evil)
		require.Equal(t, visible, bars[0].Attr["data-step"], "the same text, escaped")
		require.Equal(t, visible, bars[0].Attr["data-service"])
		require.Contains(t, bars[0].Title, visible)
		require.Len(t, having(els, "incident"), 1)
		require.Len(t, having(els, "event"), 1)
		require.Contains(t, having(els, "event")[0].Title, visible)
	})

	t.Run("EmptyTimeline", func(t *testing.T) {
		t.Parallel()
		svg := string(renderSwimlanes(Timeline{TripID: "T-none", At: t0}))
		els := parseSVG(t, svg)
		require.Equal(t, "swimlanes", els[0].Attr["id"])
		require.Contains(t, svg, "no steps yet")
		require.Empty(t, having(els, "bar step"))
	})

	t.Run("EventsOnly", func(t *testing.T) {
		t.Parallel()
		// No SERVICE_URLS: no step log rows, the events alone.
		tl := Timeline{TripID: "T-events", At: t0.Add(time.Second), Columns: []string{"trips", "hotel"}, Entries: []Entry{
			{At: t0, Column: "trips", Source: "event", What: "trip.requested"},
			{At: t0.Add(200 * time.Millisecond), Column: "hotel", Source: "event", What: "hotel.held"},
			{At: t0.Add(300 * time.Millisecond), Column: "deadletter", Source: "deadletter", What: "hotel.held parked"},
		}}
		els := parseSVG(t, string(renderSwimlanes(tl)))
		require.Empty(t, having(els, "bar step"))
		require.Len(t, having(els, "event"), 2)
		require.Len(t, having(els, "deadletter"), 1, "a lane for a column the timeline did not name")
		require.Len(t, having(els, "no-steps"), 1)
	})
}

func TestSwimTick(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		span, tick time.Duration
		label      string // of the second tick
	}{
		{0, time.Millisecond, "+1ms"},
		{250 * time.Millisecond, 50 * time.Millisecond, "+50ms"},
		{4 * time.Second, time.Second, "+1s"},
		{70 * time.Second, 15 * time.Second, "+15s"},
		{40 * time.Minute, 10 * time.Minute, "+10min"},
		{20 * time.Hour, 6 * time.Hour, "+6h"},
		{3 * 24 * time.Hour, 12 * time.Hour, "+12h"},
		{20 * 24 * time.Hour, 5 * 24 * time.Hour, "+5d"},
	} {
		got := swimTick(c.span)
		require.Equal(t, c.tick, got, "span %s", c.span)
		require.LessOrEqual(t, c.span/got, time.Duration(6))
		require.Equal(t, c.label, swimTickLabel(got, got))
	}
}

// The trip page draws the swimlanes above its table; the drawing alone
// is an SVG.
func TestSwimlanesPage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	trip := "T-swim-page"
	b.publish(t, ev(t, events.TripRequested, trip), "")
	b.publish(t, ev(t, events.HotelHeld, trip), "")
	mux := http.NewServeMux()
	b.r.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	code, page := getBody(t, hs.URL+"/trips/"+trip)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `<svg xmlns="http://www.w3.org/2000/svg" id="swimlanes"`)
	require.Less(t, strings.Index(page, `id="swimlanes"`), strings.Index(page, `id="timeline"`), "above the table")
	require.Contains(t, page, `class="event"`, "the events as dots")

	resp, err := http.Get(hs.URL + "/trips/" + trip + "/swimlanes.svg")
	require.NoError(t, err)
	svg, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "image/svg+xml", resp.Header.Get("Content-Type"))
	els := parseSVG(t, string(svg))
	require.Equal(t, "swimlanes", els[0].Attr["id"])
	require.Len(t, having(els, "event"), 2)

	code, _ = getBody(t, hs.URL+"/trips/T-nobody-knows/swimlanes.svg")
	require.Equal(t, http.StatusNotFound, code)
}
