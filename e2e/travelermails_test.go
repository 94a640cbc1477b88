package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
)

// TestTravelerMails (issue 22 item 3) runs the whole system as child
// processes with a short delay-notice limit (CANCELING_NOTICE_AFTER_MS=
// 1500) and two kill rules on the trips service: at
// trips.notice_mail.after_call (the mail relay took the notice, the
// answer is not written) and at trips.correction_mail.answer_unread (the
// relay committed the correction, its answer unread). Each fires once; the
// supervisor restarts trips, whose recovery pass asks the relay by key.
//
//   - A trip whose car is sold out and whose refund the card processor
//     refuses for good stays canceling with the refund open: its traveler
//     gets exactly one delay notice (T:mail:delayed) naming the refund,
//     and no final mail; after an operator settles the refund, exactly one
//     final mail (T:mail:canceled) beside it.
//   - A confirmed trip (its confirmation mailed) whose hold the hotel then
//     released by itself is found half by the reconciler; an operator's
//     undo_leak gets its traveler exactly one correction
//     (T:mail:correction), and a second repair of it none more.
func TestTravelerMails(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tripsaga-e2e-mails-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o711))
	markers := filepath.Join(dir, "faults")
	require.NoError(t, os.MkdirAll(markers, 0o777))
	require.NoError(t, os.Chmod(markers, 0o777))
	const token = "tok-mails"
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s, err := stack.Start(sctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{
		reconciler.OperatorTokenEnv + "=" + token, "INCIDENT_AFTER=3", "UNDO_BACKOFF_MAX_MS=1000",
		"CANCELING_NOTICE_AFTER_MS=1500", "RECONCILE_INTERVAL_MS=500",
		fault.EnvDir + "=" + markers,
		fault.EnvRules + "=" + fault.TripsNoticeMailAfterCall + ":" + fault.Kill + ":once," +
			fault.TripsCorrectionMailAnswerUnread + ":" + fault.Kill + ":once",
	}})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.LogPath("trips"))
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("==== trips log (tail)\n%s", b)
		}
	}()
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), reconciler.OperatorTokenEnv+"="+token)
		for k, v := range s.Env() {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr.String())
		}
		return string(out), err
	}
	urls := s.CompanyURLs()
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut,
		Match: map[string]string{"driver.email": "refused@example.com"}}))
	require.NoError(t, sim.AddFault(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultRefuse, Reason: "card closed",
		Match: map[string]string{"card_token": "tok_closed"}}))

	book := func(email, card string) string {
		body := strings.Replace(strings.Replace(validTrip, "tok_visa_ok", card, 1), "ada@example.com", email, 1)
		req, err := http.NewRequest(http.MethodPost, s.URL("trips")+"/trips", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "mails-"+email)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var tr struct {
			TripID string `json:"trip_id"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&tr))
		require.NotEmpty(t, tr.TripID)
		return tr.TripID
	}
	type tripView struct {
		Status   string
		OpenUndo []string `json:"open_undo"`
	}
	trip := func(id string) tripView {
		var tv tripView
		getJSON(t, s.URL("trips")+"/trips/"+id, &tv)
		return tv
	}
	type message struct{ Key, Subject, Text string }
	mails := func(id string) []message {
		var m struct{ Items []message }
		getJSON(t, urls["MAIL_URL"]+"/messages?trip_id="+url.QueryEscape(id), &m)
		return m.Items
	}
	count := func(id string) []int {
		var keys []string
		for _, m := range mails(id) {
			keys = append(keys, m.Key)
		}
		f, n, c := demo.CountMails(keys)
		return []int{f, n, c}
	}
	fired := func(rule string) map[string]string { return marker(filepath.Join(markers, rule+".fired")) }

	// The delay notice, once, though trips is killed after the relay took it.
	refused := book("refused@example.com", "tok_closed")
	testenv.Eventually(t, func() bool { return fired(fault.TripsNoticeMailAfterCall+"-kill") != nil }, "trips killed after the notice's call")
	require.Equal(t, refused, fired(fault.TripsNoticeMailAfterCall + "-kill")["trip_id"])
	testenv.Eventually(t, func() bool { return slices.Equal(count(refused), []int{0, 1, 0}) }, "one notice")
	tv := trip(refused)
	require.Equal(t, "canceling", tv.Status)
	require.Equal(t, []string{"payment"}, tv.OpenUndo)
	m := mails(refused)[0]
	require.Equal(t, refused+":mail:delayed", m.Key)
	require.Contains(t, m.Text, "The refund of your card is still under way")
	testenv.Eventually(t, func() bool {
		var st struct {
			Items []struct{ Step, Status string }
		}
		getJSON(t, s.URL("trips")+"/steps/"+refused, &st)
		return slices.ContainsFunc(st.Items, func(x struct{ Step, Status string }) bool { return x.Step == "notice_mail" && x.Status == "done" })
	}, "the notice's step is done, learned by key after the kill")
	require.Equal(t, []int{0, 1, 0}, count(refused), "the kill doubled nothing")

	out, err := cli("incidents", "settle", refused, "--service", "payment", "--outcome", "undone", "--reason", "refunded by bank transfer", "--operator", "ada")
	require.NoError(t, err, out)
	testenv.Eventually(t, func() bool { return trip(refused).Status == "canceled" }, "canceled once the refund is settled")
	testenv.Eventually(t, func() bool { return slices.Equal(count(refused), []int{1, 1, 0}) }, "one final mail beside the notice")

	// The correction, once, though trips is killed with its answer unread.
	whole := book("whole@example.com", "tok_visa_ok")
	testenv.Eventually(t, func() bool { return trip(whole).Status == "confirmed" && count(whole)[0] == 1 }, "confirmed and mailed")
	_, err = provider.Hotel(urls["HOTEL_URL"]).Undo(ctx, whole+":hotel") // the hotel gives the room away
	require.NoError(t, err)
	testenv.Eventually(t, func() bool {
		var f struct{ Items []reconciler.Finding }
		getJSON(t, s.URL("reconciler")+"/findings", &f)
		return slices.ContainsFunc(f.Items, func(f reconciler.Finding) bool {
			return f.TripID == whole && f.Kind == reconciler.FindingHalf && f.ResolvedAt == nil
		})
	}, "the reconciler finds the confirmed trip half")
	// payment refuses to undo a charge its trip's saga owns, and the
	// command says so (exit 1); trips writes the correction on seeing the
	// action all the same.
	out, err = cli("repair", "undo-leak", whole, "--service", "payment", "--reason", "room given away by the hotel, ticket 7", "--operator", "ada")
	require.ErrorContains(t, err, "exit status 1", out)
	require.Contains(t, out, "payment: refused: step is done")
	testenv.Eventually(t, func() bool { return fired(fault.TripsCorrectionMailAnswerUnread+"-kill") != nil }, "trips killed with the correction's answer unread")
	testenv.Eventually(t, func() bool { return slices.Equal(count(whole), []int{1, 0, 1}) }, "one correction")
	for _, m := range mails(whole) {
		if strings.HasSuffix(m.Key, ":mail:correction") {
			require.Equal(t, "Correction: your trip "+whole, m.Subject)
			require.Contains(t, m.Text, "room given away by the hotel, ticket 7")
		}
	}
	out, err = cli("repair", "undo-leak", whole, "--service", "hotel", "--reason", "second look", "--operator", "ada")
	require.ErrorContains(t, err, "exit status 1", out) // refused by hotel too: its saga owns the hold
	require.Contains(t, out, "hotel: refused: step is done")
	testenv.Eventually(t, func() bool {
		var st struct {
			Items []struct{ Step, Status string }
		}
		getJSON(t, s.URL("trips")+"/steps/"+whole, &st)
		return slices.ContainsFunc(st.Items, func(x struct{ Step, Status string }) bool { return x.Step == "correction_mail" && x.Status == "done" })
	}, "the correction's step is done, learned by key after the kill")
	// An action naming trips after it: once trips has logged it, it has
	// handled the second repair before (one consumer, in stream order).
	// Nothing is paused or due, so it does nothing and says so (exit 1).
	out, err = cli("repair", "resume", whole, "--service", "trips", "--reason", "nothing paused", "--operator", "ada")
	require.ErrorContains(t, err, "exit status 1", out)
	require.Contains(t, out, "trips: 0 unfinished step(s) due now")
	var oplog struct {
		Items []struct{ Action, Effect string }
	}
	testenv.Eventually(t, func() bool {
		getJSON(t, s.URL("trips")+"/operator/"+whole, &oplog)
		return len(oplog.Items) == 1
	}, "trips handled the actions after the second repair")
	require.Equal(t, []int{1, 0, 1}, count(whole), "one correction per trip")
	require.Equal(t, []int{1, 1, 0}, count(refused))
}
