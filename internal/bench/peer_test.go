package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tripsaga/tripsaga/sim"
)

// TestAuditTrips asserts that the peer's audit tells whole and empty trips
// from half, doubled and unknown ones, from the records of real simulators.
func TestAuditTrips(t *testing.T) {
	ctx := context.Background()
	sims, err := sim.New(ctx, sim.Config{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sims.Close()
	srv := httptest.NewServer(sims.Handler())
	defer srv.Close()
	post := func(path, key string, body map[string]any) {
		t.Helper()
		var rd *bytes.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		} else {
			rd = bytes.NewReader(nil)
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, rd)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	guest := map[string]string{"name": "A", "email": "a@example.com"}
	book := func(id string, car bool) {
		post("/hotel/holds", id+":hotel", map[string]any{"trip_id": id, "property_id": "P-1", "check_in": "2027-01-10", "nights": 2, "guest": guest})
		post("/payments/charges", id+":charge", map[string]any{"trip_id": id, "amount_cents": 100, "currency": "USD", "card_token": "tok_ok"})
		if car {
			post("/cars/bookings", id+":car", map[string]any{"trip_id": id, "car_class": "compact", "pickup": "2027-01-10", "return": "2027-01-12", "driver": guest})
		}
	}
	mail := func(id, outcome string) {
		post("/mail/messages", id+":mail:"+outcome, map[string]any{"to": "a@example.com", "subject": "s", "text": "t", "trip_id": id})
	}
	// T-whole: confirmed, everything done. T-empty: canceled, undone newest
	// first. T-half: canceled, the hold never released. T-twice: two mails.
	// T-stray: records, but the peer never answered it.
	book("T-whole", true)
	mail("T-whole", "confirmed")
	book("T-empty", false)
	post("/payments/charges/"+"T-empty:charge"+"/refund", "", nil)
	post("/hotel/holds/T-empty:hotel/release", "", nil)
	mail("T-empty", "canceled")
	book("T-half", false)
	post("/payments/charges/T-half:charge/refund", "", nil)
	mail("T-half", "canceled")
	book("T-twice", true)
	mail("T-twice", "confirmed")
	mail("T-twice", "canceled")
	book("T-stray", true)

	ids := []string{"T-whole", "T-empty", "T-half", "T-twice"}
	status := map[string]string{"T-whole": "confirmed", "T-empty": "canceled", "T-half": "canceled", "T-twice": "confirmed"}
	a, err := auditTrips(ctx, srv.URL, ids, status)
	if err != nil {
		t.Fatal(err)
	}
	if a.Trips != 4 || a.Whole != 1 || a.Empty != 1 || a.Bad != 3 || a.ok() {
		t.Fatalf("audit %+v", a)
	}
	got := strings.Join(a.Problems, "\n")
	for _, want := range []string{"trip T-half (canceled): hold held", "trip T-twice (confirmed)", "a record of trip T-stray"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
}
