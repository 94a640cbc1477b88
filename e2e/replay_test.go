package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/replay"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/sim"
)

// world is what a replay must leave as it was: every company's writes
// and records, the trips service's trips and the reconciler's view.
type world struct {
	Writes  map[string]int64
	Records map[string][]string // company: "key status" of every record, sorted
	Trips   []string            // "id status" of every trip, sorted
	Views   map[string]string   // trip: the reconciler's view, as JSON
}

func snapshot(t *testing.T, trips []string) world {
	t.Helper()
	ctx := context.Background()
	urls := sys.CompanyURLs()
	w := world{Writes: map[string]int64{}, Records: map[string][]string{}, Views: map[string]string{}}
	for _, c := range []*provider.Client{provider.Hotel(urls["HOTEL_URL"]), provider.Payments(urls["PAYMENTS_URL"]), provider.Cars(urls["CARS_URL"]), provider.Mail(urls["MAIL_URL"])} {
		st, err := sim.GetStats(ctx, c.BaseURL)
		require.NoError(t, err)
		require.Zero(t, st.OverlappingCalls, c.Company)
		w.Writes[c.Company] = st.Writes
		recs, err := c.List(ctx, "")
		require.NoError(t, err)
		for _, r := range recs {
			w.Records[c.Company] = append(w.Records[c.Company], r.Key()+" "+r.Status())
		}
		slices.Sort(w.Records[c.Company])
	}
	var all struct {
		Items []struct {
			TripID string `json:"trip_id"`
			Status string `json:"status"`
		} `json:"items"`
	}
	getJSON(t, sys.URL("trips")+"/trips?limit=1000", &all)
	for _, tr := range all.Items {
		w.Trips = append(w.Trips, tr.TripID+" "+tr.Status)
	}
	slices.Sort(w.Trips)
	for _, trip := range trips {
		resp, err := http.Get(sys.URL("reconciler") + "/view/" + trip)
		require.NoError(t, err)
		var v map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		resp.Body.Close()
		b, _ := json.Marshal(v)
		w.Views[trip] = string(b)
	}
	return w
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// tripsaga runs the binary against the stack and returns its stdout.
func tripsaga(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	for k, v := range sys.Env() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "tripsaga %s: %s", strings.Join(args, " "), stderr.String())
	return string(out)
}

// settled waits until the trips are final at the trips service and in the
// reconciler's view, and every consumer has nothing left.
func settled(t *testing.T, trips []string) {
	t.Helper()
	testenv.Eventually(t, func() bool {
		for _, trip := range trips {
			var tr struct{ Status string }
			getJSON(t, sys.URL("trips")+"/trips/"+trip, &tr)
			if tr.Status != "confirmed" && tr.Status != "canceled" {
				return false
			}
			var v struct{ Settled string }
			resp, err := http.Get(sys.URL("reconciler") + "/view/" + trip)
			if err != nil || resp.StatusCode != http.StatusOK {
				return false
			}
			_ = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if v.Settled == "" {
				return false
			}
		}
		return true
	}, "the trips are settled everywhere")
}

// idle reports whether every durable consumer has nothing pending.
func idle(t *testing.T, js jetstream.JetStream) bool {
	ctx := context.Background()
	for _, c := range replay.Consumers(events.Selected()) {
		for stream := range events.Selected().Streams(events.Selected().Consumes(c)) {
			cons, err := js.Consumer(ctx, stream, c)
			if err != nil {
				continue
			}
			ci, err := cons.Info(ctx)
			if err != nil || ci.NumPending+uint64(ci.NumAckPending) > 0 {
				return false
			}
		}
	}
	return true
}

// TestReplayEveryConsumerActsOnce replays every stream into every service
// and shows that no company sees a second call and the projections (the
// trips service's trips, the reconciler's view) end as they were; then a
// filtered replay, a dry run and the reconciler's shadow.
func TestReplayEveryConsumerActsOnce(t *testing.T) {
	nc, err := sys.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	var trips []string
	for i, card := range []string{"tok_visa_ok", "tok_visa_ok", "tok_declined"} {
		body := strings.Replace(validTrip, "tok_visa_ok", card, 1)
		code, out, _ := post(t, body, map[string]string{"Idempotency-Key": fmt.Sprintf("replay-e2e-%d-%s", i, card)})
		require.Contains(t, []int{201, 202}, code, out)
		trips = append(trips, out["trip_id"].(string))
	}
	settled(t, trips)
	testenv.Eventually(t, func() bool { return idle(t, js) }, "every consumer idle")
	before := snapshot(t, trips)

	ctx := context.Background()
	for _, c := range replay.Consumers(events.Selected()) {
		// Each stream from the first sequence its consumer can be reset
		// to: a consumer made again from its inbox's position (another
		// test deletes them) starts there, and a replay from before it is
		// refused (TestFromSeqExactlyOrRefused, internal/replay).
		total := 0
		for stream := range events.Selected().Streams(events.Selected().Consumes(c)) {
			cons, err := js.Consumer(ctx, stream, c)
			if err != nil {
				continue // no durable consumer there (trips on TRIPS)
			}
			from := uint64(1)
			if ci := cons.CachedInfo().Config; ci.DeliverPolicy == jetstream.DeliverByStartSequencePolicy {
				from = ci.OptStartSeq
			}
			s, err := js.Stream(ctx, stream)
			require.NoError(t, err)
			if st := s.CachedInfo().State; from > st.LastSeq || from < st.FirstSeq {
				continue
			}
			var res struct {
				Consumer        string  `json:"consumer"`
				Mode            string  `json:"mode"`
				Events          int     `json:"events"`
				EventsPerSecond float64 `json:"events_per_second"`
				Streams         []struct {
					From uint64 `json:"from_seq"`
				} `json:"streams"`
			}
			out := tripsaga(t, "replay", c, "--stream", stream, "--from-seq", fmt.Sprint(from), "--json", "--progress=false")
			require.NoError(t, json.Unmarshal([]byte(out), &res), out)
			require.Equal(t, "reset", res.Mode)
			require.Equal(t, from, res.Streams[0].From, "%s on %s from #%d exactly", c, stream, from)
			total += res.Events
			t.Logf("replay %s on %s from #%d: %d events, %.0f events/s", c, stream, from, res.Events, res.EventsPerSecond)
		}
		require.Positive(t, total, "%s got its streams again", c)
	}
	testenv.Eventually(t, func() bool { return idle(t, js) }, "every consumer idle again")
	require.Equal(t, before, snapshot(t, trips), "no company saw a call, the projections are unchanged")

	// A dry run of one trip prints its events and changes nothing.
	out := tripsaga(t, "replay", "hotel", "--from-seq", "1", "--trip", trips[0], "--dry-run", "--progress=false")
	require.Contains(t, out, "io.tripsaga.trip.requested.v1")
	require.Contains(t, out, "would be delivered to hotel")
	require.NotContains(t, out, trips[1])

	// A filtered replay hands the trip's events to the payment consumer
	// as operator actions; its inbox had them: nothing happens again.
	out = tripsaga(t, "replay", "payment", "--from-seq", "1", "--trip", trips[2], "--reason", "e2e", "--operator", "ada", "--progress=false")
	require.Contains(t, out, "handed to payment")
	testenv.Eventually(t, func() bool { return idle(t, js) }, "the actions carried out")
	require.Equal(t, before, snapshot(t, trips))

	// The reconciler's shadow has no difference for these trips.
	var shadow struct {
		Shadow struct {
			Diffs []struct {
				TripID string `json:"trip_id"`
			}
			Trips int64
		} `json:"shadow"`
	}
	out = tripsaga(t, "replay", "reconciler", "--shadow", "--json", "--progress=false")
	require.NoError(t, json.Unmarshal([]byte(out), &shadow), out)
	require.Positive(t, shadow.Shadow.Trips)
	for _, d := range shadow.Shadow.Diffs {
		require.NotContains(t, trips, d.TripID)
	}
}
