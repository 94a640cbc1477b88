package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/services/trips"
)

// stepServices serve GET /steps/{trip_id} and GET /incidents; with the
// insurance step on, insurance too (run.stepServices).
var stepServices = []string{"trips", "hotel", "payment", "car"} //nolint:gochecknoglobals // read-only

// stepServices returns the services whose steps and incidents the audit
// reads: [stepServices], and insurance when the run has an insurer.
func (r *run) stepServices() []string {
	if r.insurance() {
		return append(slices.Clone(stepServices), "insurance")
	}
	return stepServices
}

// insurance reports whether the system runs the optional insurance step
// (its insurer is among the companies: INSURER_URL).
func (r *run) insurance() bool {
	_, ok := r.companies["INSURER_URL"]
	return ok
}

// unfinished step statuses (saga.Pending, Started, Unknown, Compensating):
// the step is still being worked on.
var unfinished = []string{"pending", "started", "unknown", "compensating"} //nolint:gochecknoglobals // read-only

// trip is an item of GET /trips.
type trip struct {
	TripID    string              `json:"trip_id"`
	Status    string              `json:"status"`
	Reason    string              `json:"reason"`
	SettledAt *time.Time          `json:"settled_at"`
	Request   *events.TripRequest `json:"request"`
}

// getJSON GETs u into v, trying each of bases (the replicas) in turn, a
// few times, until one answers 200 (or 404 when ok404).
func (r *run) getJSON(ctx context.Context, bases []string, path string, v any) error {
	var last error
	for try := 0; try < 3*len(bases); try++ {
		if try >= len(bases) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, bases[try%len(bases)]+path, nil)
		if err != nil {
			return err
		}
		resp, err := r.http.Do(req)
		if err != nil {
			last = err
			continue
		}
		err = json.NewDecoder(resp.Body).Decode(v)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("GET %s: %s", path, resp.Status)
			continue
		}
		if err != nil {
			last = fmt.Errorf("GET %s: %w", path, err)
			continue
		}
		return nil
	}
	return last
}

// listTrips pages through GET /trips.
func (r *run) listTrips(ctx context.Context) ([]trip, error) {
	var out []trip
	after := ""
	for {
		var page struct {
			Items []trip `json:"items"`
			Next  string `json:"next"`
		}
		path := "/trips?limit=1000"
		if after != "" {
			path += "&after=" + url.QueryEscape(after)
		}
		if err := r.getJSON(ctx, r.trips, path, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if page.Next == "" {
			return out, nil
		}
		after = page.Next
	}
}

// companyLists counts each company's records per trip, from its own lists
// (GET /holds, /charges, /bookings, /messages, and the insurer's
// /policies with the insurance step on; every status). Of the mail
// relay's messages it counts the final mails (trips.IsFinalMailKey): a
// delay notice or a correction beside them is no duplicate.
func (r *run) companyLists(ctx context.Context) (map[string]map[string]int, error) {
	out := map[string]map[string]int{}
	colls := []struct{ env, coll string }{{"HOTEL_URL", "holds"}, {"PAYMENTS_URL", "charges"}, {"CARS_URL", "bookings"}, {"MAIL_URL", "messages"}}
	if r.insurance() {
		colls = append(colls, struct{ env, coll string }{"INSURER_URL", "policies"})
	}
	for _, c := range colls {
		counts := map[string]int{}
		after := ""
		for {
			var page struct {
				Items []struct {
					TripID string `json:"trip_id"`
					Key    string `json:"key"`
				} `json:"items"`
				Next string `json:"next"`
			}
			path := "/" + c.coll + "?limit=1000"
			if after != "" {
				path += "&after=" + url.QueryEscape(after)
			}
			if err := r.getJSON(ctx, []string{r.companies[c.env]}, path, &page); err != nil {
				return nil, err
			}
			for _, it := range page.Items {
				if c.coll == "messages" && !trips.IsFinalMailKey(it.Key) {
					continue
				}
				counts[it.TripID]++
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		out[c.coll] = counts
	}
	return out, nil
}

// auditTrip reads everything about one trip: its status (given), its steps
// on every service, the companies' records by key and the card statement
// (demo's Records; with the insurance step on, the insurer's policy by key
// too, which demo.Verdict judges: active on a confirmed trip, none in
// force on a canceled one), and its records in the companies' lists.
func (r *run) auditTrip(ctx context.Context, env *demo.Env, t trip, lists map[string]map[string]int) TripAudit {
	a := TripAudit{TripOutcome: demo.TripOutcome{TripID: t.TripID, Status: t.Status, Reason: t.Reason}, Records: map[string]int{}}
	card := ""
	if t.Request != nil {
		card = t.Request.Payment.CardToken
		a.Traveler = t.Request.Traveler.Name
	}
	a.SettledAt = t.SettledAt
	env.Records(ctx, &a.TripOutcome, card)
	for coll, counts := range lists {
		a.Records[coll] = counts[t.TripID]
	}
	for _, svc := range r.stepServices() {
		var steps struct {
			Items []struct {
				Step   string `json:"step"`
				Key    string `json:"idempotency_key"`
				Status string `json:"status"`
			} `json:"items"`
		}
		if err := r.getJSON(ctx, r.sys.URLs(svc), "/steps/"+url.PathEscape(t.TripID), &steps); err != nil {
			a.Unreadable = append(a.Unreadable, svc+" steps: "+err.Error())
			continue
		}
		for _, s := range steps.Items {
			if slices.Contains(unfinished, s.Status) {
				a.Unfinished = append(a.Unfinished, svc+" "+s.Key+" "+s.Status)
			}
		}
	}
	byKey := map[string]string{"hold": a.Hold, "charge": a.Charge, "booking": a.Booking}
	if r.insurance() {
		byKey["policy"] = a.Policy
	}
	for what, v := range byKey {
		if v == "error" || v == "" {
			a.Unreadable = append(a.Unreadable, what+" by key")
		}
	}
	return a
}

func (r *run) demoEnv() *demo.Env {
	return &demo.Env{
		TripsURL: r.trips[0], HotelURL: r.companies["HOTEL_URL"], PaymentsURL: r.companies["PAYMENTS_URL"],
		CarsURL: r.companies["CARS_URL"], MailURL: r.companies["MAIL_URL"], InsurerURL: r.companies["INSURER_URL"],
	}
}

// auditAll audits trips, eight at a time.
func (r *run) auditAll(ctx context.Context, trips []trip, lists map[string]map[string]int) []TripAudit {
	env := r.demoEnv()
	out := make([]TripAudit, len(trips))
	next := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = r.auditTrip(ctx, env, trips[i], lists)
			}
		}()
	}
	for i := range trips {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// lateCommitGrace is how long after the faults stopped a late commit drawn
// before may still land: the longest delay of the armed faults, and a
// second.
func (r *run) lateCommitGrace() time.Duration {
	var d time.Duration
	for _, f := range r.cfg.Faults {
		d = max(d, time.Duration(f.Rule.DelayMS)*time.Millisecond)
	}
	return d + time.Second
}

// settle waits until every trip is settled: confirmed or canceled, no step
// unfinished on any service, and the companies' records agree (whole or
// empty, one mail, nothing doubled). It audits the trips not yet settled
// about every second; once all are, it audits every trip again (after
// the late-commit grace), and is done when that full pass finds them all
// settled too. It returns the last audit of every trip, whether all
// settled within the limit, and when the last one did.
func (r *run) settle(ctx context.Context, stopped time.Time) ([]TripAudit, bool, time.Time) {
	deadline := stopped.Add(r.cfg.SettleLimit)
	grace := stopped.Add(r.lateCommitGrace())
	bar := r.newProgress(-1)
	defer bar.finish()
	latest := map[string]TripAudit{}
	var order []string
	var allSince time.Time // when the trips were last all seen settled
	full := false
	for {
		passStart := time.Now()
		trips, err := r.listTrips(ctx)
		var lists map[string]map[string]int
		if err == nil {
			lists, err = r.companyLists(ctx)
		}
		if err != nil {
			r.cfg.Logger.Warn("chaos: audit pass failed; trying again", "err", err)
		} else {
			var todo []trip
			for _, t := range trips {
				if _, ok := latest[t.TripID]; !ok {
					order = append(order, t.TripID)
				}
				if a, ok := latest[t.TripID]; full || !ok || !a.settled() {
					todo = append(todo, t)
				}
			}
			for _, a := range r.auditAll(ctx, todo, lists) {
				latest[a.TripID] = a
			}
			open := 0
			for _, id := range order {
				if a := latest[id]; !a.settled() {
					open++
				}
			}
			bar.show(fmt.Sprintf("chaos: settling, %d of %d trips not settled yet", open, len(order)), -1)
			switch {
			case open > 0:
				allSince, full = time.Time{}, false
			case full && passStart.After(grace):
				r.orphans = orphans(trips, lists)
				return r.collect(order, latest), true, allSince
			default:
				if allSince.IsZero() {
					allSince = passStart
				}
				full = true
				if d := time.Until(grace); d > 0 {
					time.Sleep(d)
				}
				continue
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if !full && err == nil {
				// One last full pass, so the report is about every trip as
				// it is now.
				if trips, err := r.listTrips(ctx); err == nil {
					if lists, err := r.companyLists(ctx); err == nil {
						for _, a := range r.auditAll(ctx, trips, lists) {
							if _, ok := latest[a.TripID]; !ok {
								order = append(order, a.TripID)
							}
							latest[a.TripID] = a
						}
						r.orphans = orphans(trips, lists)
					}
				}
			}
			return r.collect(order, latest), false, time.Time{}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// orphans returns the trip ids that the companies hold records of
// ("holds T-9") but the trips service never recorded.
func orphans(trips []trip, lists map[string]map[string]int) []string {
	known := map[string]bool{}
	for _, t := range trips {
		known[t.TripID] = true
	}
	var out []string
	for _, coll := range slices.Sorted(maps.Keys(lists)) {
		for _, id := range slices.Sorted(maps.Keys(lists[coll])) {
			if !known[id] {
				out = append(out, coll+" "+id)
			}
		}
	}
	return out
}

func (r *run) collect(order []string, latest map[string]TripAudit) []TripAudit {
	out := make([]TripAudit, 0, len(order))
	for _, id := range order {
		out = append(out, latest[id])
	}
	return out
}

// incidents reads GET /incidents of every step service.
func (r *run) incidents(ctx context.Context, rep *Report) {
	for _, svc := range r.stepServices() {
		var inc struct {
			Items []struct {
				Kind       string     `json:"kind"`
				ResolvedAt *time.Time `json:"resolved_at"`
			} `json:"items"`
		}
		if err := r.getJSON(ctx, r.sys.URLs(svc), "/incidents", &inc); err != nil {
			rep.Problems = append(rep.Problems, "incidents of "+svc+" unreadable: "+err.Error())
			continue
		}
		rep.Incidents[svc] = len(inc.Items)
		for _, i := range inc.Items {
			rep.IncidentsTotal++
			rep.IncidentKinds[svc+" "+i.Kind]++
			if i.ResolvedAt == nil {
				rep.IncidentsOpen++
			}
		}
	}
}

// deadLetters counts the messages in the DEADLETTER stream (-1: unknown).
func (r *run) deadLetters(ctx context.Context) int64 {
	if r.cfg.NATSURL == "" {
		return -1
	}
	opts, err := natsauth.Client{Creds: r.cfg.NATSCreds}.Options(natsauth.Admin)
	if err != nil {
		r.cfg.Logger.Warn("chaos: NATS", "err", err)
		return -1
	}
	nc, err := nats.Connect(r.cfg.NATSURL, append(opts, nats.Name("tripsaga-chaos"), nats.Timeout(5*time.Second))...)
	if err != nil {
		r.cfg.Logger.Warn("chaos: NATS", "err", err)
		return -1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return -1
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, events.StreamDeadLetter)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0
	}
	if err != nil {
		r.cfg.Logger.Warn("chaos: DEADLETTER stream", "err", err)
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil {
		return -1
	}
	return int64(info.State.Msgs)
}
