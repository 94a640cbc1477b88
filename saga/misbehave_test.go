package saga_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/services/payment"
	"github.com/tripsaga/tripsaga/sim"
)

// misbehaving is a step against one company of the simulators.
type misbehaving struct {
	*bundle
	url    string // the company's base URL
	client *provider.Client
	spec   saga.Spec
	build  saga.BuildFunc
	onDone string
}

// setupMisbehaving returns the hotel step or the payment step ("payments")
// against the simulators.
func setupMisbehaving(t *testing.T, company string) *misbehaving {
	b := setup(t)
	base := b.hotelURL[:len(b.hotelURL)-len("/hotel")]
	if company == "payments" {
		url := base + "/payments"
		return &misbehaving{bundle: b, url: url, client: provider.Payments(url), spec: payment.Spec(url), build: saga.Builder(payment.Build), onDone: events.PaymentCharged}
	}
	return &misbehaving{bundle: b, url: b.hotelURL, client: b.company, spec: hotel.Spec(b.hotelURL), build: saga.Builder(hotel.Build), onDone: events.HotelHeld}
}

func (m *misbehaving) runner(t *testing.T, timing saga.Timing) *saga.Runner {
	r, err := saga.New(saga.Config{Pool: m.pool, Spec: m.spec, Timing: timing})
	require.NoError(t, err)
	return r
}

func (m *misbehaving) request(t *testing.T, r *saga.Runner, tripID string) {
	ctx := context.Background()
	tr := trip(tripID + "@x.io")
	body, err := m.build(tripID, sagatest.JSON(t, tr))
	require.NoError(t, err)
	tx, err := m.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = r.Request(ctx, tx, saga.Request{TripID: tripID, Body: body, Carried: sagatest.JSON(t, tr)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

// applied returns how many answers the company's fault rules spoiled.
func (m *misbehaving) applied(t *testing.T) int {
	rules, err := sim.ListFaults(context.Background(), m.url)
	require.NoError(t, err)
	n := 0
	for _, r := range rules {
		n += r.Applied
	}
	return n
}

func incidents(t *testing.T, b *bundle) []saga.Incident {
	inc, err := saga.Incidents(context.Background(), b.pool)
	require.NoError(t, err)
	return inc
}

func hasIncident(t *testing.T, b *bundle, kind string) bool {
	for _, i := range incidents(t, b) {
		if i.Kind == kind {
			return true
		}
	}
	return false
}

// patient is fast, with a deadline no test reaches: an unknown outcome is
// asked again by key for as long as the test runs, never undone; and a
// call timeout no loaded machine reaches, so every answer of the
// misbehaving company is read as what it is (at load 7 a 200 ms timeout
// made some of them unknown).
func patient() saga.Timing {
	t := fast
	t.StepDeadline = time.Hour
	t.CallTimeout = 10 * time.Second
	return t
}

// TestRunnerMisbehavingCompanyForward: the step's call is answered wrongly
// (issue 6, item 4). It never becomes done on such an answer, an incident
// is raised where the answer will not get better by asking again, and once
// the company answers right the step is done with one record at the
// company, under the one key.
func TestRunnerMisbehavingCompanyForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, company, op, fault string
		incident                 string // "" = unknown only, no incident
		performed                bool   // the company did it despite the answer
	}{
		{"BodyThatDoesNotParseIsUnknown", "hotel", sim.OpHold, sim.FaultBadBody, "", true},
		{"UnknownStatusWordIsUnknown", "hotel", sim.OpHold, sim.FaultUnknownStatus, "", true},
		{"AnswerNamingAnotherKeyRaisesAMismatch", "hotel", sim.OpHold, sim.FaultWrongKey, saga.IncidentForwardAnswerMismatch, true},
		{"AnswerNamingAnotherAmountRaisesAMismatch", "payments", sim.OpCharge, sim.FaultWrongAmount, saga.IncidentForwardAnswerMismatch, true},
		{"UnauthorizedIsNotARejectionAndRaisesCredentials", "hotel", sim.OpHold, sim.FaultUnauthorized, saga.IncidentCompanyCredentials, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := setupMisbehaving(t, tc.company)
			require.NoError(t, sim.AddFault(ctx, m.url, sim.Rule{Op: tc.op, Fault: tc.fault}))
			r := m.runner(t, patient())
			tripID := "T-" + tc.fault
			key := r.Key(tripID)
			m.request(t, r, tripID)

			// Several calls and asks by key, every one answered wrongly.
			runUntil(t, r, func() bool {
				return m.applied(t) >= 6 && (tc.incident == "" || hasIncident(t, m.bundle, tc.incident))
			}, "the company is asked again by key")
			s := step(t, m.bundle, tripID)
			require.Contains(t, []string{"unknown", "started"}, s.Status, "never done on a bad answer")
			require.Greater(t, s.Attempts, 1, "the same request was sent again")
			require.Empty(t, outboxTypes(t, m.bundle, tripID), "nothing published")
			records, err := m.client.List(ctx, "") // lists are answered right
			require.NoError(t, err)
			if tc.performed {
				require.Len(t, records, 1, "the company did it once, despite its answers")
			} else {
				require.Empty(t, records, "nothing happened at the company")
			}
			inc := incidents(t, m.bundle)
			if tc.incident == "" {
				require.Empty(t, inc, "an answer that may get better is only unknown")
			} else {
				require.Len(t, inc, 1)
				require.Equal(t, tc.incident, inc[0].Kind)
				require.Nil(t, inc[0].ResolvedAt)
			}

			// The company answers right again: the same key is learned.
			require.NoError(t, sim.ClearFaults(ctx, m.url))
			runUntil(t, r, func() bool { return step(t, m.bundle, tripID).Status == "done" }, "done once the company answers right")
			require.Equal(t, []string{m.onDone}, outboxTypes(t, m.bundle, tripID))
			st, err := m.client.Status(ctx, key)
			require.NoError(t, err)
			require.Equal(t, m.client.ActiveStatus, st.Status)
			require.Equal(t, st.Ref, step(t, m.bundle, tripID).CompanyRef)
			records, err = m.client.List(ctx, "")
			require.NoError(t, err)
			require.Len(t, records, 1, "one record at the company, whatever the retries")
			require.Equal(t, key, records[0].Key())
			if tc.company == "payments" {
				stmt := statement(t, m.url, "tok_ok")
				require.Len(t, stmt, 1, "charged once")
				require.EqualValues(t, 100, stmt[0]["amount_cents"], "the amount asked")
			}
			for _, i := range incidents(t, m.bundle) {
				require.NotNil(t, i.ResolvedAt, "%s resolved once the step settled on a good answer", i.Kind)
			}
		})
	}
}

// TestRunnerMisbehavingCompanyUndo: the undo is answered wrongly. The step
// stays compensating (never counted undone on such an answer), an incident
// is raised, and once the company answers right it is compensated, with
// the one record released.
func TestRunnerMisbehavingCompanyUndo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, fault string
		incident    string
	}{
		{"BodyThatDoesNotParseIsRetriedUntilStuck", sim.FaultBadBody, saga.IncidentCompensationStuck},
		{"UnknownStatusWordIsRetriedUntilStuck", sim.FaultUnknownStatus, saga.IncidentCompensationStuck},
		{"AnswerNamingAnotherKeyRaisesAMismatchAtOnce", sim.FaultWrongKey, saga.IncidentCompensationAnswerMismatch},
		{"UnauthorizedIsARefusal", sim.FaultUnauthorized, saga.IncidentCompensationRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := setupMisbehaving(t, "hotel")
			r := m.runner(t, patient())
			tripID := "T-undo-" + tc.fault
			m.request(t, r, tripID)
			recoverPass(t, r)
			require.Equal(t, "done", step(t, m.bundle, tripID).Status)
			require.NoError(t, sim.AddFault(ctx, m.url, sim.Rule{Op: sim.OpRelease, Fault: tc.fault}))
			undo(t, m.bundle, r, tripID)

			runUntil(t, r, func() bool {
				return m.applied(t) >= 6 && hasIncident(t, m.bundle, tc.incident)
			}, "the undo is retried by key")
			s := step(t, m.bundle, tripID)
			require.Equal(t, "compensating", s.Status, "never undone on a bad answer")
			require.Greater(t, s.UndoAttempts, 1)
			require.Equal(t, []string{events.HotelHeld}, outboxTypes(t, m.bundle, tripID))
			kinds := []string{}
			for _, i := range incidents(t, m.bundle) {
				kinds = append(kinds, i.Kind)
			}
			require.Contains(t, kinds, tc.incident)
			if tc.incident == saga.IncidentCompensationAnswerMismatch {
				// Raised at the first answer; compensation_stuck follows
				// after IncidentAfter attempts, as for any failing undo.
				require.Subset(t, []string{tc.incident, saga.IncidentCompensationStuck}, kinds)
			} else {
				require.Len(t, kinds, 1)
			}

			require.NoError(t, sim.ClearFaults(ctx, m.url))
			_, err := m.pool.Exec(ctx, "UPDATE steps SET next_attempt_at = now() WHERE trip_id = $1", tripID)
			require.NoError(t, err)
			runUntil(t, r, func() bool { return step(t, m.bundle, tripID).Status == "compensated" }, "compensated once the company answers right")
			require.Equal(t, []string{events.HotelHeld, events.HotelReleased}, outboxTypes(t, m.bundle, tripID))
			require.Equal(t, "released", companyStatus(t, m.bundle, r.Key(tripID)))
			records, err := m.client.List(ctx, "")
			require.NoError(t, err)
			require.Len(t, records, 1, "one hold, released")
			for _, i := range incidents(t, m.bundle) {
				require.NotNil(t, i.ResolvedAt, "%s resolved once the undo worked", i.Kind)
			}
		})
	}
}

// statement returns the card's statement lines at the card processor.
func statement(t *testing.T, paymentsURL, card string) []map[string]any {
	var out struct {
		Lines []map[string]any `json:"lines"`
	}
	resp, err := http.Get(paymentsURL + "/statements/" + card)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return out.Lines
}
