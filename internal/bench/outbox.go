package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/reconciler"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// RelayResult is the outbox relay's throughput, measured with the outbox
// package's own Write and Relay.PublishBatch in a scratch schema.
type RelayResult struct {
	// Backlog is the number of events written before draining.
	Backlog int `json:"backlog"`
	// DrainPerS: the backlog published by one relay, events/s.
	DrainPerS float64 `json:"drain_events_per_s"`
	// WithWritersPerS: a second backlog published while Writers writers
	// keep writing one event per transaction, events/s; WritersPerS is
	// what the writers wrote meanwhile, events/s.
	WithWritersPerS float64 `json:"with_writers_events_per_s"`
	Writers         int     `json:"writers"`
	WritersPerS     float64 `json:"writers_events_per_s"`
	// WithWritersS is how long that took, s: until the second backlog was
	// published, or 20 s at most.
	WithWritersS float64 `json:"with_writers_s"`
	// WritePerS is how fast the backlog was written (100 events per
	// transaction, 4 writers), events/s.
	WritePerS float64 `json:"backlog_write_events_per_s"`
}

// RebuildRun is one rebuild of the reconciler's projection.
type RebuildRun struct {
	Events     int     `json:"events"`
	Trips      int64   `json:"trips"`
	DurationS  float64 `json:"duration_s"`
	EventsPerS float64 `json:"events_per_s"`
}

// schemaPool makes schema (dropped first) with the migration sets and
// returns a pool whose search_path is schema.
func schemaPool(ctx context.Context, databaseURL, schema string, conns int, sets ...string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	admin, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	_, err = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	admin.Close()
	if err != nil {
		return nil, fmt.Errorf("bench: drop %s: %w", schema, err)
	}
	if err := tripsql.Migrate(ctx, databaseURL, schema, sets...); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pcfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return pool, nil
}

func benchRequest() *events.TripRequest {
	return &events.TripRequest{
		Traveler: events.Person{Name: "Bench Traveler", Email: "bench@example.com"},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: "2027-01-15", Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: "2027-01-15", Return: "2027-01-17"},
		Payment:  events.PaymentRequest{CardToken: "tok_bench", AmountCents: 33000, Currency: "USD"},
	}
}

// tripEvents are the five events of a confirmed trip, as its services
// publish them.
func tripEvents(trip string) ([]event.Event, error) {
	req := benchRequest()
	carried, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	step := func(s string) events.StepData {
		return events.StepData{TripID: trip, Step: s, IdempotencyKey: trip + ":" + s, CompanyRef: "X-" + trip, Request: carried}
	}
	specs := []struct {
		svc, typ string
		data     any
	}{
		{"trips", events.TripRequested, events.TripRequestedData{TripID: trip, Request: *req}},
		{"hotel", events.HotelHeld, step("hotel")},
		{"payment", events.PaymentCharged, step("payment")},
		{"car", events.CarBooked, step("car")},
		{"trips", events.TripConfirmed, events.TripSettledData{TripID: trip, Status: "confirmed", Traveler: req.Traveler}},
	}
	out := make([]event.Event, 0, len(specs))
	for _, s := range specs {
		e, err := events.New(events.Source(s.svc), s.typ, trip, s.data)
		if err != nil {
			return nil, fmt.Errorf("bench: event: %w", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// writeBacklog writes n events (trip.requested of distinct trips) with
// outbox.Write, per transactions of 100, from 4 writers.
func writeBacklog(ctx context.Context, pool *pgxpool.Pool, n int, tag string) (time.Duration, error) {
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for {
				from := next.Add(100) - 100
				if from >= int64(n) {
					return
				}
				to := min(from+100, int64(n))
				evs := make([]event.Event, 0, to-from)
				for i := from; i < to; i++ {
					trip := fmt.Sprintf("T-%s-%d", tag, i)
					e, err := events.New(events.Source("trips"), events.TripRequested, trip, events.TripRequestedData{TripID: trip, Request: *benchRequest()})
					if err != nil {
						errs <- err
						return
					}
					evs = append(evs, e)
				}
				if err := inTx(ctx, pool, evs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("bench: outbox backlog: %w", err)
	}
	return time.Since(start), nil
}

func inTx(ctx context.Context, pool *pgxpool.Pool, evs []event.Event) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := outbox.Write(ctx, tx, evs...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// drain calls PublishBatch until it has published want events (or, with
// want 0, until nothing is left) and returns how many it published.
func drain(ctx context.Context, r *outbox.Relay, want int) (int, error) {
	total := 0
	for ctx.Err() == nil {
		k, err := r.PublishBatch(ctx)
		if err != nil {
			return total, fmt.Errorf("bench: relay: %w", err)
		}
		total += k
		if want > 0 && total >= want {
			return total, nil
		}
		if k == 0 {
			if want == 0 {
				return total, nil
			}
			time.Sleep(time.Millisecond)
		}
	}
	return total, ctx.Err()
}

// relayBench measures the relay on a scratch schema (migrated with the saga
// set) publishing to js.
func relayBench(ctx context.Context, databaseURL string, js jetstream.JetStream, n int) (RelayResult, error) {
	res := RelayResult{Backlog: n, Writers: 4}
	pool, err := schemaPool(ctx, databaseURL, "bench_relay", 16, tripsql.SetSaga)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js})
	if err != nil {
		return res, fmt.Errorf("bench: relay: %w", err)
	}
	wt, err := writeBacklog(ctx, pool, n, "a")
	if err != nil {
		return res, err
	}
	res.WritePerS = round(float64(n)/wt.Seconds(), 0)
	start := time.Now()
	got, err := drain(ctx, relay, 0)
	if err != nil {
		return res, err
	}
	if got < n {
		return res, fmt.Errorf("bench: relay published %d of %d events", got, n)
	}
	res.DrainPerS = round(float64(got)/time.Since(start).Seconds(), 0)

	// A second backlog, drained while writers add one event per transaction.
	if _, err := writeBacklog(ctx, pool, n, "b"); err != nil {
		return res, err
	}
	wctx, stop := context.WithCancel(ctx)
	var written atomic.Int64
	var wg sync.WaitGroup
	for w := range res.Writers {
		wg.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				trip := fmt.Sprintf("T-w%d-%d", w, i)
				e, err := events.New(events.Source("trips"), events.TripRequested, trip, events.TripRequestedData{TripID: trip, Request: *benchRequest()})
				if err != nil {
					return
				}
				if inTx(wctx, pool, []event.Event{e}) == nil {
					written.Add(1)
				}
			}
		})
	}
	start = time.Now()
	dctx, cancel := context.WithTimeout(ctx, withWritersMax)
	got, err = drain(dctx, relay, n)
	cancel()
	el := time.Since(start)
	w := written.Load()
	stop()
	wg.Wait()
	if err != nil && dctx.Err() == nil {
		return res, err
	}
	res.WithWritersPerS = round(float64(got)/el.Seconds(), 0)
	res.WritersPerS = round(float64(w)/el.Seconds(), 0)
	res.WithWritersS = round(el.Seconds(), 1)
	return res, nil
}

// withWritersMax bounds the relay-with-writers measurement.
const withWritersMax = 20 * time.Second

// rebuildBench publishes n events (five per confirmed trip) to the event
// streams of js, rebuilds the reconciler's projection from them in a scratch
// schema, then publishes n more and rebuilds from 2n.
func rebuildBench(ctx context.Context, databaseURL string, js jetstream.JetStream, n int) ([]RebuildRun, error) {
	for _, s := range []string{events.StreamDeadLetter, "TRIPS", "HOTEL", "PAYMENT", "CAR"} {
		if st, err := js.Stream(ctx, s); err == nil {
			if err := st.Purge(ctx); err != nil {
				return nil, fmt.Errorf("bench: purge %s: %w", s, err)
			}
		}
	}
	pool, err := schemaPool(ctx, databaseURL, "bench_reconciler", 8, tripsql.SetSaga, tripsql.SetReconciler)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var runs []RebuildRun
	for r := range 2 {
		if err := publishTrips(ctx, js, n/5, fmt.Sprintf("r%d", r)); err != nil {
			return nil, err
		}
		stats, err := reconciler.Replay(ctx, reconciler.ReplayConfig{Pool: pool, JetStream: js})
		if err != nil {
			return nil, fmt.Errorf("bench: rebuild: %w", err)
		}
		want := (r + 1) * (n / 5) * 5
		if stats.Events != want {
			return nil, fmt.Errorf("bench: rebuild read %d events, want %d", stats.Events, want)
		}
		runs = append(runs, RebuildRun{Events: stats.Events, Trips: stats.Trips,
			DurationS: round(stats.Duration.Seconds(), 3), EventsPerS: round(stats.EventsPerSecond(), 0)})
	}
	return runs, nil
}

func publishTrips(ctx context.Context, js jetstream.JetStream, trips int, tag string) error {
	for i := range trips {
		evs, err := tripEvents(fmt.Sprintf("T-%s-%d", tag, i))
		if err != nil {
			return err
		}
		for _, e := range evs {
			h, err := events.EncodeHeaders(e)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			subj, err := events.Subject(e.Type(), e.Subject())
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			m := &nats.Msg{Subject: subj, Data: e.Data(), Header: nats.Header{}}
			for k, v := range h {
				m.Header[k] = []string{v}
			}
			if _, err := js.PublishMsgAsync(m, jetstream.WithMsgID(e.ID())); err != nil {
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx.Done():
					return ctx.Err()
				}
				if _, err := js.PublishMsgAsync(m, jetstream.WithMsgID(e.ID())); err != nil {
					return fmt.Errorf("bench: publish: %w", err)
				}
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("bench: rebuild events: PubAcks missing after 60 s")
	}
}
