package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/natsauth"
)

// Hops is where one trip's time goes, hop by hop along its happy path,
// read from what the trips of one closed loop left behind: the time each
// transaction began (PostgreSQL's now(): a trip's row, an inbox row, an
// outbox row) and the time JetStream stored each event (its message's
// timestamp, read back by stream sequence). A hop's time includes every
// wait inside it: commits, round trips, the company's answer, a process
// waking up.
type Hops struct {
	// Clients of the closed loop the trips come from.
	Clients int `json:"clients"`
	// Trips measured: confirmed trips with every stamp of the path.
	Trips int `json:"trips"`
	// Total is from the request's transaction to the projection's
	// transaction that confirmed the trip, ms.
	Total Quantiles `json:"total"`
	Hops  []Hop     `json:"hops"`
}

// Hop is one leg of the path, in ms.
type Hop struct {
	From string `json:"from"`
	To   string `json:"to"`
	// What the hop holds, in words.
	What string `json:"what"`
	Quantiles
}

// Quantiles of a duration, ms.
type Quantiles struct {
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
}

// hopStamp is one stamp of the trip's happy path: a transaction's start in
// a service's schema, or an event's store in its stream, with what the hop
// to it holds.
type hopStamp struct{ stamp, what string }

// hopPath is the trip's happy path as stamps.
func hopPath() []hopStamp {
	return []hopStamp{
		{"trips: request tx", ""},
		{"TRIPS: trip.requested stored", "the request's statements and commit, the publish (fsync)"},
		{"hotel: inbox tx", "delivery to hotel, its decoding, BEGIN"},
		{"hotel: answer tx", "inbox and step rows committed, the hold (HTTP), BEGIN"},
		{"HOTEL: hotel.held stored", "the answer's statements and commit, the publish (fsync)"},
		{"payment: inbox tx", "delivery to payment, its decoding, BEGIN"},
		{"payment: answer tx", "inbox and step rows committed, the charge (HTTP), BEGIN"},
		{"PAYMENT: payment.charged stored", "the answer's statements and commit, the publish (fsync)"},
		{"car: inbox tx", "delivery to car, its decoding, BEGIN"},
		{"car: answer tx", "inbox and step rows committed, the booking (HTTP), BEGIN"},
		{"CAR: car.booked stored", "the answer's statements and commit, the publish (fsync)"},
		{"trips: projection tx", "delivery to trips, its decoding, BEGIN of the projection that confirms"},
	}
}

// hopEventsSQL reads the outbox rows of the trips in $1 in every schema
// on the path: who wrote it, its id, trip, type, transaction start, and
// the stream and sequence its PubAck gave (the store times are
// JetStream's). One scan of each outbox, so the cost grows with the rows.
const hopEventsSQL = `
SELECT svc, event_id, trip, typ, created_at, coalesce(stream, ''), coalesce(stream_seq, 0) FROM (
  SELECT 'trips' svc, event_id, headers->>'ce-subject' trip, headers->>'ce-type' typ, created_at, stream, stream_seq FROM trips.outbox
  UNION ALL SELECT 'hotel', event_id, headers->>'ce-subject', headers->>'ce-type', created_at, stream, stream_seq FROM hotel.outbox
  UNION ALL SELECT 'payment', event_id, headers->>'ce-subject', headers->>'ce-type', created_at, stream, stream_seq FROM payment.outbox
  UNION ALL SELECT 'car', event_id, headers->>'ce-subject', headers->>'ce-type', created_at, stream, stream_seq FROM car.outbox
) o WHERE trip = ANY($1)`

// hopReceiptsSQL reads when each service's inbox transaction of the events
// $1 began.
const hopReceiptsSQL = `
SELECT 'trips', event_id, received_at FROM trips.inbox WHERE event_id = ANY($1)
UNION ALL SELECT 'hotel', event_id, received_at FROM hotel.inbox WHERE event_id = ANY($1)
UNION ALL SELECT 'payment', event_id, received_at FROM payment.inbox WHERE event_id = ANY($1)
UNION ALL SELECT 'car', event_id, received_at FROM car.inbox WHERE event_id = ANY($1)`

// hopEvent is one outbox row of a trip on the path.
type hopEvent struct {
	id      string
	created time.Time // its transaction's start
	stream  string
	seq     int64
}

// hopKinds are the path's events in order, by a part of their type, with
// the service that consumes each next on the path.
var hopKinds = [4]struct{ kind, next string }{ //nolint:gochecknoglobals // a table
	{".trip.requested.", "hotel"}, {".hotel.held.", "payment"}, {".payment.charged.", "car"}, {".car.booked.", "trips"},
}

// measureHops reads the stamps of the trips ids (from conn, on the
// system's database, and from the streams on natsURL, as natsauth.Admin
// with its seed file creds) and sums them up hop by hop. A trip missing a
// stamp (not confirmed, an event not marked with its sequence yet, a
// stream message gone) is left out.
func measureHops(ctx context.Context, conn *pgx.Conn, natsURL, creds string, clients int, ids []string) (*Hops, error) {
	requested := map[string]time.Time{}
	rows, err := conn.Query(ctx, "SELECT trip_id, created_at FROM trips.trips WHERE trip_id = ANY($1) AND status = 'confirmed'", ids)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			rows.Close()
			return nil, fmt.Errorf("bench: hops: %w", err)
		}
		requested[id] = at
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	evs := map[string]*[4]*hopEvent{} // trip -> the path's events
	var eventIDs []string
	rows, err = conn.Query(ctx, hopEventsSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	for rows.Next() {
		var svc, trip, typ string
		var e hopEvent
		if err := rows.Scan(&svc, &e.id, &trip, &typ, &e.created, &e.stream, &e.seq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("bench: hops: %w", err)
		}
		for i, k := range hopKinds {
			if !strings.Contains(typ, k.kind) {
				continue
			}
			if evs[trip] == nil {
				evs[trip] = &[4]*hopEvent{}
			}
			if evs[trip][i] == nil {
				evs[trip][i] = &e
				eventIDs = append(eventIDs, e.id)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	received := map[string]time.Time{} // service/event id -> its inbox transaction's start
	rows, err = conn.Query(ctx, hopReceiptsSQL, eventIDs)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	for rows.Next() {
		var svc, id string
		var at time.Time
		if err := rows.Scan(&svc, &id, &at); err != nil {
			rows.Close()
			return nil, fmt.Errorf("bench: hops: %w", err)
		}
		received[svc+"/"+id] = at
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	opts, err := natsauth.Client{Creds: creds}.Options(natsauth.Admin)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	streams := map[string]jetstream.Stream{}
	stored := func(name string, seq int64) (time.Time, bool) {
		if name == "" || seq <= 0 {
			return time.Time{}, false
		}
		s, ok := streams[name]
		if !ok {
			if s, err = js.Stream(ctx, name); err != nil {
				return time.Time{}, false
			}
			streams[name] = s
		}
		m, err := s.GetMsg(ctx, uint64(seq))
		if err != nil {
			return time.Time{}, false
		}
		return m.Time, true
	}
	h := &Hops{Clients: clients}
	hp := hopPath()
	legs := make([][]float64, len(hp)-1)
	var totals []float64
	for trip, req := range requested {
		te := evs[trip]
		if te == nil {
			continue
		}
		// The path's stamps in order: request, stored, inbox, answer,
		// stored, inbox, answer, stored, inbox, answer, stored, projection.
		path := []time.Time{req}
		for i, k := range hopKinds {
			e := te[i]
			if e == nil {
				break
			}
			if i > 0 {
				path = append(path, e.created) // the answer's transaction wrote it
			}
			t, found := stored(e.stream, e.seq)
			if !found {
				break
			}
			path = append(path, t)
			at, ok := received[k.next+"/"+e.id]
			if !ok {
				break
			}
			path = append(path, at)
		}
		if len(path) != len(hp) {
			continue
		}
		for i := range legs {
			legs[i] = append(legs[i], ms(path[i+1].Sub(path[i])))
		}
		totals = append(totals, ms(path[len(path)-1].Sub(path[0])))
	}
	h.Trips = len(totals)
	if h.Trips == 0 {
		return h, nil
	}
	h.Total = quantiles(totals)
	for i, xs := range legs {
		h.Hops = append(h.Hops, Hop{From: hp[i].stamp, To: hp[i+1].stamp, What: hp[i+1].what, Quantiles: quantiles(xs)})
	}
	return h, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantiles of xs (not empty), rounded to 0.01 ms.
func quantiles(xs []float64) Quantiles {
	s := slices.Clone(xs)
	slices.Sort(s)
	at := func(p float64) float64 { return round(s[min(len(s)-1, int(p*float64(len(s))))], 2) }
	return Quantiles{P50: at(0.5), P95: at(0.95)}
}
