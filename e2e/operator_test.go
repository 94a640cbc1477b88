package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
)

// TestOperatorCommandsEndToEnd runs a system of its own whose reconciler
// takes actions (OPERATOR_TOKEN) and whose undos back off for ten minutes,
// so that only an operator's retry moves a refused refund on; then a
// poison event's dead letters are listed, shown and one re-driven into the
// consumer that parked it (and parked again there, as it still cannot be
// decoded).
func TestOperatorCommandsEndToEnd(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tripsaga-e2e-op-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o711))
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s, err := stack.Start(sctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{
		reconciler.OperatorTokenEnv + "=tok-e2e", "UNDO_BACKOFF_MAX_MS=600000",
	}})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	cli := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), reconciler.OperatorTokenEnv+"=tok-e2e")
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

	// The car is sold out and the card processor refuses the refund: an
	// incident at payment, the next undo in ten minutes.
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Times: 1}))
	refuse, err := sim.AddFaultRule(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultRefuse, Reason: "card closed"})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, s.URL("trips")+"/trips", strings.NewReader(validTrip))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "op-e2e-1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var trip struct {
		TripID string `json:"trip_id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&trip))
	resp.Body.Close()
	require.NotEmpty(t, trip.TripID)

	var incidents struct {
		Items []struct {
			Service  string `json:"service"`
			TripID   string `json:"trip_id"`
			Kind     string `json:"kind"`
			Resolved *time.Time
		} `json:"items"`
	}
	testenv.Eventually(t, func() bool {
		out, err := cli(t, "incidents", "list", "--json")
		if err != nil || json.Unmarshal([]byte(out), &incidents) != nil {
			return false
		}
		for _, in := range incidents.Items {
			if in.TripID == trip.TripID && in.Service == "payment" && in.Kind == "compensation_refused" {
				return true
			}
		}
		return false
	}, "the refused refund is an incident at payment")
	out, err := cli(t, "incidents", "list")
	require.NoError(t, err)
	require.Contains(t, out, trip.TripID)

	_, err = sim.RemoveFault(ctx, urls["PAYMENTS_URL"], refuse.ID)
	require.NoError(t, err)
	out, err = cli(t, "incidents", "retry", trip.TripID, "--service", "payment", "--reason", "card processor fixed the card", "--operator", "ada", "--key", "retry-1")
	require.NoError(t, err)
	require.Contains(t, out, "retry_undo of trip "+trip.TripID+" asked of payment by ada")
	_, err = cli(t, "incidents", "retry", trip.TripID, "--service", "payment", "--reason", "card processor fixed the card", "--operator", "ada", "--key", "retry-1")
	require.NoError(t, err, "the same key again is the same action")
	testenv.Eventually(t, func() bool {
		var tr struct{ Status string }
		getJSON(t, s.URL("trips")+"/trips/"+trip.TripID, &tr)
		return tr.Status == "canceled"
	}, "refunded and released once retried")
	var actions struct{ Items []json.RawMessage }
	getJSON(t, s.URL("reconciler")+"/api/actions?trip="+trip.TripID, &actions)
	require.Len(t, actions.Items, 1, "the audit trail has the retry once")
	var oplog struct {
		Items []struct {
			Action, Operator, Reason, Effect string
		}
		Paused bool
	}
	getJSON(t, s.URL("payment")+"/operator/"+trip.TripID, &oplog)
	require.Len(t, oplog.Items, 1, "payment carried the retry out once")
	require.Equal(t, "retry_undo", oplog.Items[0].Action)
	require.Equal(t, "ada", oplog.Items[0].Operator)
	require.Equal(t, "1 unfinished step(s) due now", oplog.Items[0].Effect)
	require.False(t, oplog.Paused)

	// A poison event on hotel.held: payment, trips and the reconciler each
	// park it; the reconciler's copy is re-driven into it alone, then
	// trips' copy into trips.
	nc, err := s.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer nc.Close()
	_, err = nc.RequestMsg(&nats.Msg{Subject: "hotel.held.T-op-poison", Data: []byte("{not json"), Header: nats.Header{"ce-specversion": {"1.0"}}}, 5*time.Second)
	require.NoError(t, err)
	var dls []reconciler.DeadLetter
	testenv.Eventually(t, func() bool {
		out, err := cli(t, "deadletter", "list", "--json")
		return err == nil && json.Unmarshal([]byte(out), &dls) == nil && len(dls) >= 3
	}, "three parked copies")
	var mine reconciler.DeadLetter
	for _, d := range dls {
		if d.Consumer == "reconciler" {
			mine = d
		}
	}
	require.Equal(t, "HOTEL", mine.Stream)
	require.Contains(t, mine.Reason, "cannot decode")
	out, err = cli(t, "deadletter", "show", fmt.Sprint(mine.Seq))
	require.NoError(t, err)
	require.Contains(t, out, "{not json")
	require.Contains(t, out, "parked")
	out, err = cli(t, "deadletter", "redrive", fmt.Sprint(mine.Seq), "--reason", "decoder fixed", "--operator", "ada")
	require.NoError(t, err)
	require.Contains(t, out, "asked of reconciler")
	testenv.Eventually(t, func() bool {
		out, err := cli(t, "deadletter", "list", "--json")
		if err != nil || json.Unmarshal([]byte(out), &dls) != nil {
			return false
		}
		for _, d := range dls {
			if d.Consumer == "reconciler" && d.Stream == "OPERATOR" {
				return strings.Contains(d.Reason, "still cannot be decoded")
			}
		}
		return false
	}, "the reconciler, and it alone, tried it again and parked the re-drive with why")
	out, err = cli(t, "deadletter", "show", fmt.Sprint(mine.Seq), "--json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &mine))
	require.Len(t, mine.RedrivenBy, 1)

	// The trips service's copy is re-driven into trips alone the same way.
	var theirs reconciler.DeadLetter
	for _, d := range dls {
		if d.Consumer == "trips" && d.Stream == "HOTEL" {
			theirs = d
		}
	}
	require.NotZero(t, theirs.Seq, "trips parked its copy")
	// The command waits for what trips did: it parked the re-drive again
	// (the event still cannot be decoded), so it says so and exits 1.
	out, err = cli(t, "deadletter", "redrive", fmt.Sprint(theirs.Seq), "--reason", "decoder fixed", "--operator", "ada")
	require.ErrorContains(t, err, "exit status 1", out)
	require.Contains(t, out, "asked of trips")
	require.Contains(t, out, "trips: parked by trips on DEADLETTER")
	testenv.Eventually(t, func() bool {
		out, err := cli(t, "deadletter", "list", "--json")
		if err != nil || json.Unmarshal([]byte(out), &dls) != nil {
			return false
		}
		for _, d := range dls {
			if d.Consumer == "trips" && d.Stream == "OPERATOR" {
				return strings.Contains(d.Reason, "still cannot be decoded")
			}
		}
		return false
	}, "trips tried it again and parked the re-drive with why")
}
