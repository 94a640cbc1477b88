package bench

import (
	"context"
	"fmt"
	"slices"
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

// hopStampsSQL reads, for the trips in $1, the stamps of hopPath that
// PostgreSQL holds, and the stream and sequence of the four events (the
// store times are JetStream's).
const hopStampsSQL = `
WITH t AS (SELECT trip_id, created_at FROM trips.trips WHERE trip_id = ANY($1) AND status = 'confirmed'),
ev AS (
  SELECT 'trips' svc, event_id, headers->>'ce-subject' trip, headers->>'ce-type' typ, created_at, stream, stream_seq FROM trips.outbox WHERE headers->>'ce-subject' = ANY($1)
  UNION ALL SELECT 'hotel', event_id, headers->>'ce-subject', headers->>'ce-type', created_at, stream, stream_seq FROM hotel.outbox WHERE headers->>'ce-subject' = ANY($1)
  UNION ALL SELECT 'payment', event_id, headers->>'ce-subject', headers->>'ce-type', created_at, stream, stream_seq FROM payment.outbox WHERE headers->>'ce-subject' = ANY($1)
  UNION ALL SELECT 'car', event_id, headers->>'ce-subject', headers->>'ce-type', created_at, stream, stream_seq FROM car.outbox WHERE headers->>'ce-subject' = ANY($1)
),
rcv AS (
  SELECT 'trips' svc, event_id, received_at FROM trips.inbox
  UNION ALL SELECT 'hotel', event_id, received_at FROM hotel.inbox
  UNION ALL SELECT 'payment', event_id, received_at FROM payment.inbox
  UNION ALL SELECT 'car', event_id, received_at FROM car.inbox
)
SELECT t.trip_id, t.created_at,
  (SELECT r.received_at FROM ev JOIN rcv r ON r.event_id = ev.event_id AND r.svc = 'hotel' WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.trip.requested.%' LIMIT 1),
  (SELECT created_at FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.hotel.held.%' LIMIT 1),
  (SELECT r.received_at FROM ev JOIN rcv r ON r.event_id = ev.event_id AND r.svc = 'payment' WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.hotel.held.%' LIMIT 1),
  (SELECT created_at FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.payment.charged.%' LIMIT 1),
  (SELECT r.received_at FROM ev JOIN rcv r ON r.event_id = ev.event_id AND r.svc = 'car' WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.payment.charged.%' LIMIT 1),
  (SELECT created_at FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.car.booked.%' LIMIT 1),
  (SELECT r.received_at FROM ev JOIN rcv r ON r.event_id = ev.event_id AND r.svc = 'trips' WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.car.booked.%' LIMIT 1),
  (SELECT created_at FROM ev WHERE ev.trip = t.trip_id AND ev.svc = 'trips' AND ev.typ LIKE '%.trip.confirmed.%' LIMIT 1),
  (SELECT coalesce(stream, '') FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.trip.requested.%' LIMIT 1),
  (SELECT coalesce(stream_seq, 0) FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.trip.requested.%' LIMIT 1),
  (SELECT coalesce(stream, '') FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.hotel.held.%' LIMIT 1),
  (SELECT coalesce(stream_seq, 0) FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.hotel.held.%' LIMIT 1),
  (SELECT coalesce(stream, '') FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.payment.charged.%' LIMIT 1),
  (SELECT coalesce(stream_seq, 0) FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.payment.charged.%' LIMIT 1),
  (SELECT coalesce(stream, '') FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.car.booked.%' LIMIT 1),
  (SELECT coalesce(stream_seq, 0) FROM ev WHERE ev.trip = t.trip_id AND ev.typ LIKE '%.car.booked.%' LIMIT 1)
FROM t`

// measureHops reads the stamps of the trips ids (from conn, on the
// system's database, and from the streams on natsURL, as natsauth.Admin
// with its seed file creds) and sums them up
// hop by hop. A trip missing a stamp (its event not marked with its
// sequence yet, a stream message gone) is left out.
func measureHops(ctx context.Context, conn *pgx.Conn, natsURL, creds string, clients int, ids []string) (*Hops, error) {
	rows, err := conn.Query(ctx, hopStampsSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("bench: hops: %w", err)
	}
	type trip struct {
		db      [9]*time.Time // request, hotel inbox, hotel answer, payment inbox, ...
		streams [4]string
		seqs    [4]int64
	}
	var trips []trip
	for rows.Next() {
		var id string
		var tr trip
		var req time.Time
		dest := []any{&id, &req}
		for i := 1; i < len(tr.db); i++ {
			dest = append(dest, &tr.db[i])
		}
		for i := range tr.streams {
			dest = append(dest, &tr.streams[i], &tr.seqs[i])
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("bench: hops: %w", err)
		}
		tr.db[0] = &req
		trips = append(trips, tr)
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
	for _, tr := range trips {
		// The path's stamps in order: request, stored, inbox, answer,
		// stored, inbox, answer, stored, inbox, answer, stored, projection.
		path := make([]time.Time, 0, len(hp))
		ok := true
		add := func(t *time.Time) {
			if t == nil {
				ok = false
				return
			}
			path = append(path, *t)
		}
		add(tr.db[0])
		for i := range 4 {
			t, found := stored(tr.streams[i], tr.seqs[i])
			if !found {
				ok = false
				break
			}
			add(&t)
			if i < 3 {
				add(tr.db[1+2*i]) // inbox tx
				add(tr.db[2+2*i]) // answer tx
			} else {
				add(tr.db[7]) // trips' inbox tx of car.booked: the projection
			}
		}
		if !ok || len(path) != len(hp) {
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
