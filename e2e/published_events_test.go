package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/events/asyncapi"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/sim"
)

// TestPublishedEventsMatchTheAsyncAPIDocument books a whole trip and
// three canceled ones (hotel sold out, car sold out, card declined) on the
// running system, waits for each trip's mail, then reads every message of
// every event stream (TRIPS, HOTEL, PAYMENT, CAR) from the first with a
// JetStream ordered consumer, and checks each event the system published
// against events/asyncapi.yaml: the CloudEvents headers each message must
// carry, its subject on its stream, and its data against the schema of its
// ce-type. Messages other tests put on the streams by hand (their trip was
// never recorded and no relay published them: no Nats-Msg-Id) are not the
// system's and are only counted. Its file sorts after e2e_test.go, so in
// `go test ./e2e` it runs after the demo's situations and the other tests
// of the shared stack and checks their events too.
func TestPublishedEventsMatchTheAsyncAPIDocument(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	doc, err := os.ReadFile("../" + asyncapi.Path)
	require.NoError(t, err)
	v, err := asyncapi.NewValidator(doc)
	require.NoError(t, err)

	e := env()
	nonce := time.Now().UTC().Format("150405.000000")
	mine := map[string]string{} // trip -> how it should end
	code, body, _ := post(t, strings.Replace(validTrip, "ada@example.com", "asyncapi-whole-"+nonce+"@example.com", 1), map[string]string{"Prefer": "wait=30"})
	require.Equal(t, http.StatusCreated, code, "%v", body)
	require.Equal(t, "confirmed", body["status"])
	mine[body["trip_id"].(string)] = "confirmed"

	soldOut := "asyncapi-hotel-sold-out-" + nonce + "@example.com"
	require.NoError(t, sim.AddFault(ctx, e.HotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultSoldOut, Match: map[string]string{"guest.email": soldOut}}))
	code, body, _ = post(t, strings.Replace(validTrip, "ada@example.com", soldOut, 1), map[string]string{"Prefer": "wait=30"})
	require.Equal(t, http.StatusCreated, code, "%v", body)
	require.Equal(t, "canceled", body["status"])
	mine[body["trip_id"].(string)] = "canceled"

	for _, s := range demo.SituationsOf(events.Selected()) {
		if s.Name != "car sold out" && s.Name != "card declined" {
			continue
		}
		o := s.Run(ctx, e)
		require.True(t, o.OK, "%s: %+v", s.Name, o)
		for _, tr := range o.Trips {
			mine[tr.TripID] = tr.Status
		}
	}
	require.Len(t, mine, 4)

	nc, err := sys.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	trips, err := js.Stream(ctx, events.StreamTrips)
	require.NoError(t, err)
	for trip := range mine {
		require.Eventually(t, func() bool {
			_, err := trips.GetLastMsgForSubject(ctx, "mail.sent."+trip)
			return err == nil
		}, time.Minute, 100*time.Millisecond, "the mail of %s is sent", trip)
	}

	recorded := map[string]bool{}
	isRecorded := func(trip string) bool {
		if ok, seen := recorded[trip]; seen {
			return ok
		}
		resp, err := http.Get(sys.URL("trips") + "/trips/" + trip)
		require.NoError(t, err)
		resp.Body.Close()
		recorded[trip] = resp.StatusCode == http.StatusOK
		return recorded[trip]
	}

	streams := map[string]bool{}
	for _, et := range events.Default.Types {
		streams[et.Stream] = true
	}
	seenTypes := map[string]int{}
	mineTypes := map[string][]string{}
	checked, foreign := 0, 0
	var bad []string
	var held jetstream.Msg // one of our trips' hotel.held, as published
	for _, name := range []string{events.StreamTrips, events.StreamHotel, events.StreamPayment, events.StreamCar} {
		require.True(t, streams[name], "the catalogue has stream %s", name)
		stream, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		last := info.State.LastSeq
		cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
		require.NoError(t, err)
		var seq uint64
		for seq < last {
			batch, err := cons.Fetch(int(min(500, last-seq)), jetstream.FetchMaxWait(5*time.Second))
			require.NoError(t, err)
			n := 0
			for m := range batch.Messages() {
				n++
				md, err := m.Metadata()
				require.NoError(t, err)
				seq = md.Sequence.Stream
				h := m.Headers()
				trip := m.Subject()[strings.LastIndexByte(m.Subject(), '.')+1:]
				if h.Get("Nats-Msg-Id") == "" && !isRecorded(trip) {
					foreign++
					continue
				}
				checked++
				typ := h.Get("ce-type")
				seenTypes[typ]++
				if _, ok := mine[trip]; ok {
					mineTypes[trip] = append(mineTypes[trip], typ)
					if typ == events.HotelHeld {
						held = m
					}
				}
				var problems []string
				for _, attr := range []string{"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-time", "ce-datacontenttype", "Nats-Msg-Id"} {
					if h.Get(attr) == "" {
						problems = append(problems, "no "+attr+" header")
					}
				}
				if et, ok := events.Default.Lookup(typ); !ok || et.Stream != name {
					problems = append(problems, fmt.Sprintf("type %q does not belong on stream %s", typ, name))
				}
				if err := v.Validate(m.Subject(), h, m.Data()); err != nil {
					problems = append(problems, err.Error())
				}
				if _, err := events.Decode(h, m.Data()); err != nil {
					problems = append(problems, "our codec refuses it: "+err.Error())
				}
				if len(problems) > 0 {
					bad = append(bad, fmt.Sprintf("%s #%d %s: %s\n  data %s", name, seq, m.Subject(), strings.Join(problems, "; "), m.Data()))
				}
			}
			require.NoError(t, batch.Error())
			require.Positive(t, n, "stream %s: nothing more after #%d of %d", name, seq, last)
		}
	}
	t.Logf("checked %d events against %s (%d put on the streams by other tests, not the system's); by type: %v", checked, asyncapi.Path, foreign, seenTypes)
	require.Empty(t, bad, "events that do not match %s:\n%s", asyncapi.Path, strings.Join(bad, "\n"))

	// The four trips went through the paths they should have, so the
	// check saw those events.
	want := map[string][]string{
		"confirmed":     {events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarBooked, events.TripConfirmed, events.MailSent},
		"hotel":         {events.TripRequested, events.HotelRejected, events.TripCanceled, events.MailSent},
		"car sold out":  {events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefunded, events.HotelReleased, events.TripCanceled, events.MailSent},
		"card declined": {events.TripRequested, events.HotelHeld, events.PaymentDeclined, events.HotelReleased, events.TripCanceled, events.MailSent},
	}
	paths := map[string]int{}
	for _, got := range mineTypes {
		for path, w := range want {
			if len(got) == len(w) && !slices.ContainsFunc(w, func(typ string) bool { return !slices.Contains(got, typ) }) {
				paths[path]++
			}
		}
	}
	require.Equal(t, map[string]int{"confirmed": 1, "hotel": 1, "car sold out": 1, "card declined": 1}, paths, "each trip's events: %v", mineTypes)
	// The same event with a field of the wrong type is refused.
	require.NotNil(t, held)
	wrong := strings.Replace(string(held.Data()), `"nights":2`, `"nights":"2"`, 1)
	require.NotEqual(t, string(held.Data()), wrong)
	require.NoError(t, v.Validate(held.Subject(), held.Headers(), held.Data()))
	require.ErrorIs(t, v.Validate(held.Subject(), held.Headers(), []byte(wrong)), asyncapi.ErrInvalid, "nights as a string")

	var never []string
	for _, typ := range v.Types() {
		if seenTypes[typ] == 0 {
			never = append(never, typ)
		}
	}
	if len(never) > 0 {
		t.Logf("types no test had published yet when this one read the streams: %v", never)
	}
}
