package reconciler

import (
	"context"
	"encoding/json"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
)

// opsOf serves a service's operator endpoints (process.Process.HandleOps: GET
// /steps/{trip_id}, GET /incidents) on the bundle's database, whose schema
// holds the saga tables like every service's.
func (b *bundle) opsOf(t *testing.T, name string) string {
	t.Helper()
	p := &process.Process{Name: name, Pool: b.pool, Mux: http.NewServeMux(), Log: slog.New(slog.DiscardHandler)}
	p.HandleOps()
	hs := httptest.NewServer(p.Mux)
	t.Cleanup(hs.Close)
	return hs.URL
}

func getBody(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// A trip's timeline gathers its events from every stream and the copy
// parked on DEADLETTER, the step log rows and incidents its service
// serves, and the company's record, in time order and in columns per
// service; the JSON API and the page show it, and the search finds the
// trip by its id, a step key and a company record id.
func TestTimeline(t *testing.T) {
	t.Parallel()
	var payURL string
	b := setup(t, func(c *Config) { c.Services = map[string]string{"payment": "http://placeholder"} })
	payURL = b.opsOf(t, "payment")
	b.r.cfg.Services = map[string]string{"payment": payURL}
	ctx := context.Background()
	trip := "T-timeline-1"
	other := "T-timeline-2"

	// Events of the trip on TRIPS, HOTEL and PAYMENT, a second trip's
	// event that must not show, and a copy of one parked on DEADLETTER.
	base := time.Now().UTC().Add(-time.Minute)
	for i, typ := range []string{events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefunded} {
		e := ev(t, typ, trip)
		e.SetTime(base.Add(time.Duration(i) * time.Second))
		b.publish(t, e, "")
	}
	b.publish(t, ev(t, events.TripRequested, other), "")
	parked := ev(t, events.HotelHeld, trip)
	m := msgOf(t, parked)
	m.Subject = events.DeadLetterSubjectPrefix + ".HOTEL.trips"
	m.Header.Set(inbox.HeaderDeadReason, "handler failed: boom")
	m.Header.Set(inbox.HeaderDeadStream, "HOTEL")
	m.Header.Set(inbox.HeaderDeadSeq, "2")
	m.Header.Set(inbox.HeaderDeadSubject, "hotel.held."+trip)
	m.Header.Set(inbox.HeaderDeadConsumer, "trips")
	_, err := b.js.PublishMsg(ctx, m)
	require.NoError(t, err)

	// The payment service's step row and an open incident.
	_, err = b.pool.Exec(ctx, `INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, company_ref, outcome,
		attempts, undo_attempts, deadline_at, last_error, created_at, finished_at)
		VALUES ($1, 'payment', $1 || ':payment', '{}', 'f', '{}', 'compensating', 'ch_1', '201 charged', 1, 3, now(), 'refund: 503', $2, $3)`,
		trip, base.Add(500*time.Millisecond), base.Add(1500*time.Millisecond))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO incidents (trip_id, step, kind, attempts, last_error, raised_at) VALUES ($1, 'payment', 'compensation_stuck', 3, 'refund: 503', $2)`,
		trip, base.Add(4500*time.Millisecond))
	require.NoError(t, err)
	// The payment service carried out an operator's retry, and a pause is
	// on.
	_, err = b.pool.Exec(ctx, `INSERT INTO operator_log (event_id, trip_id, action, operator, reason, effect, at)
		VALUES ('ev-1', $1, 'retry_undo', 'ada', 'refunds work again', 'undo due now', $2)`, trip, base.Add(4200*time.Millisecond))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO trip_pauses (trip_id, operator, reason, event_id) VALUES ($1, 'grace', 'card processor down', 'ev-2')`, trip)
	require.NoError(t, err)
	// The card processor's record of the charge.
	res, err := b.r.cfg.Companies["payment"].Create(ctx, trip+":payment", map[string]any{
		"trip_id": trip, "card_token": "tok_visa_ok", "amount_cents": 100, "currency": "USD"})
	require.NoError(t, err)
	require.Equal(t, "charged", res.Status)

	b.start(t)
	testenv.Eventually(t, b.caughtUp, "projection caught up")

	tl, err := b.r.Timeline(ctx, trip)
	require.NoError(t, err)
	require.NotNil(t, tl.View)
	require.Equal(t, "canceling", tl.View.Status)
	require.Empty(t, tl.Unread)
	var whats []string
	for i, e := range tl.Entries {
		whats = append(whats, e.Column+" "+e.What)
		if i > 0 {
			require.False(t, e.At.Before(tl.Entries[i-1].At), "time order")
		}
	}
	require.Equal(t, []string{
		"trips trip.requested", "payment payment started", "hotel hotel.held", "payment payment finished",
		"payment payment.charged", "car car.rejected", "payment payment.refunded", "payment retry_undo carried out", "payment incident compensation_stuck raised",
		"deadletter parked by trips", "payment payment undo not done yet",
	}, whats)
	require.Equal(t, []string{"trips", "hotel", "payment", "car", "deadletter"}, tl.Columns)
	for _, e := range tl.Entries {
		require.NotContains(t, e.Detail, other)
		if e.Source == "deadletter" {
			require.Contains(t, e.Detail, "handler failed: boom")
			require.Equal(t, "hotel.held."+trip, e.Headers[inbox.HeaderDeadSubject])
		}
	}
	require.Len(t, tl.Incidents, 1)
	require.Contains(t, tl.Stopped, "canceling, not settled")
	require.Contains(t, tl.Stopped, "open incident at payment: compensation_stuck after 3 attempt(s)")
	require.Contains(t, tl.Stopped, "1 event(s) parked on DEADLETTER")
	require.Contains(t, tl.Stopped, "retries paused at payment: paused by grace: card processor down")
	recs := map[string]CompanyRecord{}
	for _, r := range tl.Records {
		recs[r.Step] = r
	}
	require.Equal(t, "charged", recs["payment"].Record.Status())
	require.Equal(t, trip+":payment", recs["payment"].Key)
	require.Nil(t, recs["hotel"].Record, "the hotel has no hold of this trip")
	require.Empty(t, recs["hotel"].Error)

	t.Run("JSONAndPage", func(t *testing.T) {
		mux := http.NewServeMux()
		b.r.Register(mux)
		hs := httptest.NewServer(mux)
		t.Cleanup(hs.Close)
		code, body := getBody(t, hs.URL+"/api/trips/"+trip+"/timeline")
		require.Equal(t, http.StatusOK, code)
		var got Timeline
		require.NoError(t, json.Unmarshal([]byte(body), &got))
		require.Len(t, got.Entries, len(tl.Entries))
		code, _ = getBody(t, hs.URL+"/api/trips/T-nobody/timeline")
		require.Equal(t, http.StatusNotFound, code)

		// Issue 19 item 5: a query with a control character was passed
		// to the trips service, which refused it, and the search called
		// the trips service unread.
		code, body = getBody(t, hs.URL+"/api/search?q=%00")
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, body, "q: holds the control character U+0000")

		code, page := getBody(t, hs.URL+"/trips/"+trip)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "Where it stopped:")
		require.Contains(t, page, "payment.refunded")
		require.Contains(t, page, `&#34;action&#34;:&#34;retry_undo&#34;`)
		require.Contains(t, page, "re-drive")

		code, page = getBody(t, hs.URL+"/incidents")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, trip)
		require.Contains(t, page, "compensation_stuck")

		code, page = getBody(t, hs.URL+"/deadletters")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "handler failed: boom")
		require.Contains(t, page, `href="/trips/`+trip+`"`)
		require.Contains(t, page, `&#34;action&#34;:&#34;redrive&#34;`)

		code, page = getBody(t, hs.URL+"/")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, `id="chart"`)
		require.Contains(t, page, "unfinished trips")
	})

	t.Run("Figures", func(t *testing.T) {
		f, err := b.r.Figures(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, f.Unfinished, "the canceling trip, and the other trip, only requested")
		require.Len(t, f.HalfPerDay, 7)
		mfs, err := b.reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
		require.Equal(t, float64(f.Unfinished), got["tripsaga_reconciler_unfinished_trips"])
		require.Positive(t, got["tripsaga_reconciler_oldest_unfinished_age_seconds"])
	})

	t.Run("Search", func(t *testing.T) {
		hits, _ := b.r.Search(ctx, trip)
		require.Equal(t, []SearchHit{{trip, "trip id"}}, hits)
		hits, _ = b.r.Search(ctx, trip+":hotel")
		require.Equal(t, []SearchHit{{trip, "step key"}}, hits)
		hits, _ = b.r.Search(ctx, res.Ref)
		require.Equal(t, []SearchHit{{trip, "company record"}}, hits)
		hits, unread := b.r.Search(ctx, "nobody@example.com")
		require.Empty(t, hits)
		require.Contains(t, strings.Join(unread, "\n"), "trips: its URL is not known")
	})
}

func TestParseServiceURLs(t *testing.T) {
	t.Parallel()
	got, err := ParseServiceURLs(" trips=http://127.0.0.1:1/, hotel=https://h:2 ,")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"trips": "http://127.0.0.1:1", "hotel": "https://h:2"}, got)
	for _, bad := range []string{"trips", "=http://x", "trips=ftp://x", "trips=http://"} {
		_, err := ParseServiceURLs(bad)
		require.ErrorIs(t, err, ErrInvalidConfig, bad)
		require.Contains(t, err.Error(), ServiceURLsEnv)
	}
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	var ss []sample
	for i := 1; i <= 100; i++ {
		ss = append(ss, sample{time.Now(), float64(i) / 1000})
	}
	at := percentiles(ss)
	require.Equal(t, AnswerTimes{N: 100, P50: 50 * time.Millisecond, P95: 95 * time.Millisecond, P99: 99 * time.Millisecond}, at)
	require.Equal(t, AnswerTimes{}, percentiles(nil))
	require.Equal(t, AnswerTimes{N: 1, P50: 7 * time.Millisecond, P95: 7 * time.Millisecond, P99: 7 * time.Millisecond}, percentiles([]sample{{time.Now(), .007}}))
}

// Issue 19 item 1: the page of an orphan (a hold for a trip nobody
// requested) asks the hotel by the step's key though no step row gives
// it, and says what it holds, that the sweep found it and what to do,
// instead of "nothing is known" and "none".
func TestTimelineOfAnOrphan(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // no SERVICE_URLS: no step log is read
	trip := "T-orphan-page"
	b.hold(t, trip)
	b.sweep(t)
	tl, err := b.r.Timeline(context.Background(), trip)
	require.NoError(t, err)
	recs := map[string]CompanyRecord{}
	for _, r := range tl.Records {
		recs[r.Step] = r
	}
	require.Equal(t, trip+":hotel", recs["hotel"].Key)
	require.Equal(t, KeyFromConvention, recs["hotel"].KeyFrom)
	require.Equal(t, "held", recs["hotel"].Record.Status(), "the hold the finding names, read by its key")
	require.Equal(t, trip+":charge", recs["payment"].Key, "the card step's key is named charge")
	require.True(t, recs["payment"].None, "asked, and the card processor has none")
	require.Contains(t, tl.Stopped, "the sweep found it orphan")

	mux := http.NewServeMux()
	b.r.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	code, page := getBody(t, hs.URL+"/trips/"+trip)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "<b>held</b>")
	require.Contains(t, page, "none: the company has no record of this key")
	require.Contains(t, page, template.HTMLEscapeString(FindingToDo(FindingOrphan)))
	require.NotContains(t, page, "nothing is known of this trip")
}

// Issue 19 item 7: a name with a bidirectional override (U+202E) or a
// zero-width space (U+200B), which the trips API accepts as sent, is shown
// on the console, not obeyed: escaped in the event's data (the same JSON
// value) and written as <U+202E> in its summary.
func TestTimelineShowsInvisibleCharacters(t *testing.T) {
	t.Parallel()
	req := originRequest("ada@example.com")
	req.Traveler.Name = "Ada \u202eelpmaxE\u200b"
	raw, err := json.Marshal(req)
	require.NoError(t, err)
	e, err := events.New(events.Source("hotel"), events.HotelHeld, "T-BIDI", events.StepData{
		TripID: "T-BIDI", Step: "hotel", IdempotencyKey: "T-BIDI:hotel", Reason: "held for \u202eAda", Request: raw,
	})
	require.NoError(t, err)
	m := msgOf(t, e)
	en := eventEntry(events.Default, events.StreamHotel, &jetstream.RawStreamMsg{Subject: m.Subject, Header: m.Header, Data: m.Data, Sequence: 1, Time: time.Now()})
	require.NotContains(t, string(en.Data), "\u202e")
	require.NotContains(t, string(en.Data), "\u200b")
	require.Contains(t, string(en.Data), `Ada \u202eelpmaxE\u200b`)
	var back events.StepData
	require.NoError(t, json.Unmarshal(en.Data, &back))
	var got events.TripRequest
	require.NoError(t, json.Unmarshal(back.Request, &got))
	require.Equal(t, req.Traveler.Name, got.Traveler.Name, "the same value, escaped")
	require.NotContains(t, en.Detail, "\u202e")
	require.Contains(t, en.Detail, "<U+202E>")

	require.Equal(t, []byte(`{"a":"\ud83d\ude00"}`), escapeInvisible([]byte(`{"a":"\ud83d\ude00"}`)), "nothing to escape: as it was")
}
