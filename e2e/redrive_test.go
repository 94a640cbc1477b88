package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
)

// TestRedriveFromAStepEndToEnd (issue 20 item 3): a confirmed trip whose
// mail.sent the reconciler lost (never handled) is re-driven from its
// first step, so every one of its events goes back to every service that
// consumes it (the hotel, payment, car and trips services and the
// reconciler), each as a redrive action through the service's operator
// inbox: every step service reports it had the event already, no company
// sees a call, no trip changes, and the reconciler's view is whole again
// (mail.sent counted once). Not parallel: the companies' write counts
// are the whole stack's.
func TestRedriveFromAStepEndToEnd(t *testing.T) {
	req, err := http.NewRequest(http.MethodPost, sys.URL("trips")+"/trips", strings.NewReader(validTrip))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "redrive-from-e2e-1")
	req.Header.Set("Prefer", "wait=30")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var trip struct {
		TripID string `json:"trip_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&trip))
	resp.Body.Close()
	require.NotEmpty(t, trip.TripID)
	testenv.Eventually(t, func() bool {
		var v struct {
			Status string `json:"status"`
			Mailed bool   `json:"mailed"`
		}
		resp, err := http.Get(sys.URL("reconciler") + "/view/" + trip.TripID)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&v) == nil && v.Status == "confirmed" && v.Mailed
	}, "the trip confirmed and mailed, as the reconciler sees it")
	before := snapshot(t, []string{trip.TripID})

	var dry reconciler.RedrivePlan
	require.NoError(t, json.Unmarshal([]byte(tripsaga(t, "redrive", trip.TripID, "--from-step", "hotel", "--dry-run", "--json")), &dry))
	consumers := map[string]bool{}
	for _, d := range dry.Deliveries {
		consumers[d.Consumer] = true
	}
	for _, c := range []string{"hotel", "payment", "car", "trips", reconciler.ProjectionName} {
		require.True(t, consumers[c], "a delivery to %s: %+v", c, dry.Deliveries)
	}
	var actions struct{ Items []json.RawMessage }
	getJSON(t, sys.URL("reconciler")+"/api/actions?trip="+trip.TripID, &actions)
	require.Empty(t, actions.Items, "a dry run records nothing")

	// The reconciler "never handled" the trip's mail.sent: its inbox row
	// and its part of the view gone.
	mail := slices.IndexFunc(dry.Deliveries, func(d reconciler.RedriveDelivery) bool {
		return d.Kind == events.Kind(events.MailSent) && d.Consumer == reconciler.ProjectionName
	})
	require.GreaterOrEqual(t, mail, 0, "%+v", dry.Deliveries)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sys.DatabaseURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	tag, err := admin.Exec(ctx, "DELETE FROM reconciler.inbox WHERE consumer = 'reconciler' AND event_id = $1", dry.Deliveries[mail].EventID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	_, err = admin.Exec(ctx, `UPDATE reconciler.trip_view SET mailed = false, seen = array_remove(seen, 'mail.sent'), events = events - 1
		WHERE trip_id = $1`, trip.TripID)
	require.NoError(t, err)
	var mailed bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT mailed FROM reconciler.trip_view WHERE trip_id = $1", trip.TripID).Scan(&mailed))
	require.False(t, mailed)

	cmd := exec.Command(bin, "redrive", trip.TripID, "--from-step", "hotel", "--reason", "checking nothing acts twice", "--operator", "ada", "--key", "from-hotel-1", "--json")
	for k, v := range sys.Env() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.Output()
	require.NoError(t, err, string(out))
	var plan reconciler.RedrivePlan
	require.NoError(t, json.Unmarshal(out, &plan))
	require.Len(t, plan.Actions, len(dry.Deliveries))
	require.Equal(t, dry.Deliveries[0].EventID, plan.Deliveries[0].EventID)

	for _, d := range plan.Deliveries {
		if d.Consumer == reconciler.ProjectionName {
			continue // it keeps no operator log
		}
		var o reconciler.ActionOutcome
		testenv.Eventually(t, func() bool {
			getJSON(t, sys.URL("reconciler")+"/api/actions/"+d.ActionID+"/outcome", &o)
			return o.Reported
		}, "%s carried out the re-drive of %s", d.Consumer, d.Kind)
		require.Contains(t, o.Effect, d.Consumer+" had its event already", "%s of %s", d.Kind, d.Consumer)
	}
	var oplog struct {
		Items []struct{ Action, Operator, Reason, Effect string }
	}
	getJSON(t, sys.URL("payment")+"/operator/"+trip.TripID, &oplog)
	require.NotEmpty(t, oplog.Items)
	require.True(t, slices.ContainsFunc(oplog.Items, func(e struct{ Action, Operator, Reason, Effect string }) bool {
		return e.Action == "redrive" && e.Operator == "ada" && e.Reason == "redrive from hotel: checking nothing acts twice"
	}), "%+v", oplog.Items)

	// The reconciler's operator inbox takes every action (carrying out
	// its own re-drives, acknowledging the others).
	testenv.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM reconciler.inbox WHERE consumer = 'reconciler' AND event_id = ANY($1)", plan.Actions).Scan(&n)
		return err == nil && n == len(plan.Actions)
	}, "the reconciler carried out its re-drives")
	after := snapshot(t, []string{trip.TripID})
	require.Equal(t, before, after, "no company call, no trip changed, the view whole again: mail.sent handled once more, every other event dropped as a duplicate")
}
