// Package interop holds the interoperability tests of tripsaga's events
// with other CloudEvents SDKs: here Node's (npm "cloudevents") with the NATS
// JetStream client for Node, run by `node interop.mjs` (see that file).
package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/sagatest"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// sentEvent is one event as the Node side must see it.
type sentEvent struct {
	Stream      string            `json:"stream"`
	NATSSubject string            `json:"nats_subject"`
	Attributes  map[string]string `json:"attributes"`
	Data        any               `json:"data"`
}

type expectations struct {
	Streams []string    `json:"streams"`
	Events  []sentEvent `json:"events"`
	Publish struct {
		TripID string `json:"trip_id"`
		Type   string `json:"type"`
		Data   any    `json:"data"`
	} `json:"publish"`
}

type nodeReport struct {
	Received []sentEvent `json:"received"`
	Sent     []struct {
		Stream     string            `json:"stream"`
		Seq        uint64            `json:"seq"`
		Attributes map[string]string `json:"attributes"`
		Data       json.RawMessage   `json:"data"`
	} `json:"sent"`
	Errors []string `json:"errors"`
}

// attributes returns every attribute of e as a string, as the CloudEvents
// type system's canonical string forms (what the binding puts in headers).
func attributes(t *testing.T, e event.Event) map[string]string {
	t.Helper()
	a := map[string]string{
		"specversion": e.SpecVersion(), "id": e.ID(), "source": e.Source(), "type": e.Type(),
		"time": types.FormatTime(e.Time()),
	}
	if v := e.Subject(); v != "" {
		a["subject"] = v
	}
	if v := e.DataContentType(); v != "" {
		a["datacontenttype"] = v
	}
	if v := e.DataSchema(); v != "" {
		a["dataschema"] = v
	}
	for k, v := range e.Extensions() {
		s, err := types.Format(v)
		require.NoError(t, err)
		a[k] = s
	}
	return a
}

// npmCI installs interop/node's locked packages into a temp folder and
// returns it, with interop.mjs copied in. It skips the test when node or
// npm is missing.
func npmCI(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("interop with Node's CloudEvents SDK skipped: %s is not installed (apt-get install nodejs npm; .ci/run installs them)", tool)
		}
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "interop.mjs"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm ci (interop/node's package-lock.json):\n%s", out)
	return dir
}

// TestNodeCloudEventsSDK (issue 10 item 3): events written by our outbox and
// published by our relay are read from JetStream by a Node consumer built on
// the CloudEvents SDK, which decodes every attribute (percent-decoding the
// ce- headers as the NATS protocol binding says) and the data, identical to
// what was sent; and events that Node builds with the SDK and publishes with
// JetStream are accepted by our codec with every attribute intact, the
// non-ASCII subject, extension and source included.
func TestNodeCloudEventsSDK(t *testing.T) {
	dir := npmCI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	srv, _, js := testenv.JetStream(t)
	const interopStream, interopSubject = "INTEROP", "interop.node"
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: interopStream, Subjects: []string{"interop.>"}})
	require.NoError(t, err)

	// One event of every type of the catalogue, each on its own stream,
	// written by outbox.Write and published by a relay.
	trip := "T-" + ulid.Make().String()
	request := events.TripRequest{
		Traveler: events.Person{Name: "Zoë Ünal 東京", Email: "zoe@example.com"},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: "2027-03-01", Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: "2027-03-01", Return: "2027-03-03"},
		Payment:  events.PaymentRequest{CardToken: "tok_visa_ok", AmountCents: 33000, Currency: "EUR"},
	}
	var evs []event.Event
	for i, et := range events.Default.Types {
		var data any = events.StepData{TripID: trip, Step: events.Kind(et.Type), IdempotencyKey: trip + ":" + events.Kind(et.Type),
			CompanyRef: "R-" + et.Type, Reason: `50% "off" — Zürich`, Request: sagatest.JSON(t, request)}
		if et.Type == events.TripRequested {
			data = events.TripRequestedData{TripID: trip, Request: request}
		}
		e, err := events.New(events.Source(et.Service), et.Type, trip, data)
		require.NoError(t, err)
		if i == 0 {
			e.SetDataSchema("https://tripsaga.example/schemas/" + events.Kind(et.Type) + ".json?v=1&x=%41")
			e.SetExtension("partnernote", `Hôtel "Zürich" 東京 100% sûr`)
			e.SetExtension("attempt", 3)
		}
		evs = append(evs, e)
	}
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, evs...))
	require.NoError(t, tx.Commit(ctx))
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(rctx) }()
	defer func() { stop(); <-relayDone }()

	var exp expectations
	for _, e := range evs {
		subject, err := events.Subject(e.Type(), e.Subject())
		require.NoError(t, err)
		stream, ok := events.Default.StreamOf(subject)
		require.True(t, ok, subject)
		var data any
		require.NoError(t, json.Unmarshal(e.Data(), &data))
		exp.Events = append(exp.Events, sentEvent{Stream: stream, NATSSubject: subject, Attributes: attributes(t, e), Data: data})
		if !slices.Contains(exp.Streams, stream) {
			exp.Streams = append(exp.Streams, stream)
		}
	}
	testenv.Eventually(t, func() bool {
		n := 0
		for _, s := range exp.Streams {
			st, err := js.Stream(ctx, s)
			if err != nil {
				return false
			}
			n += int(st.CachedInfo().State.Msgs)
		}
		return n == len(evs)
	}, "the relay publishes the %d events", len(evs))

	exp.Publish.TripID = trip
	exp.Publish.Type = events.TripRequested
	exp.Publish.Data = events.TripRequestedData{TripID: trip, Request: request}
	expFile := filepath.Join(dir, "expected.json")
	b, err := json.MarshalIndent(exp, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(expFile, b, 0o644))

	// Node reads them all, then publishes its own.
	cmd := exec.CommandContext(ctx, "node", "interop.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NATS_URL="+srv.ClientURL(), natsauth.EnvCreds+"="+testenv.Creds(t, srv, natsauth.Admin),
		"EXPECTED="+expFile, "PUBLISH_SUBJECT="+interopSubject)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var rep nodeReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("node interop.mjs: %v (%v)\nstdout: %s\nstderr: %s", runErr, err, stdout.String(), stderr.String())
	}
	for _, e := range rep.Errors {
		t.Errorf("node: %s", e)
	}
	require.NoError(t, runErr, "node interop.mjs\nstderr: %s", stderr.String())

	// What Node decoded is what we sent (Node checked it too).
	require.Len(t, rep.Received, len(evs))
	for _, got := range rep.Received {
		i := slices.IndexFunc(exp.Events, func(w sentEvent) bool { return w.Attributes["id"] == got.Attributes["id"] })
		require.GreaterOrEqual(t, i, 0, "node received an event we did not send: %v", got.Attributes)
		require.Equal(t, exp.Events[i].Attributes, got.Attributes)
		require.Equal(t, exp.Events[i].NATSSubject, got.NATSSubject)
		require.Equal(t, exp.Events[i].Data, got.Data)
	}

	// What Node sent, our codec accepts, attribute for attribute.
	nonASCII := func(s string) bool { return strings.ContainsFunc(s, func(r rune) bool { return r > 127 }) }
	require.Len(t, rep.Sent, 2)
	stream, err := js.Stream(ctx, interopStream)
	require.NoError(t, err)
	for _, sent := range rep.Sent {
		require.Equal(t, interopStream, sent.Stream)
		msg, err := stream.GetMsg(ctx, sent.Seq)
		require.NoError(t, err)
		e, err := events.Decode(msg.Header, msg.Data)
		require.NoError(t, err, "events.Decode of Node's %s (headers %v)", sent.Attributes["id"], msg.Header)
		got := attributes(t, e)
		want := maps.Clone(sent.Attributes)
		wantTime, err := types.ParseTime(want["time"])
		require.NoError(t, err)
		require.True(t, e.Time().Equal(wantTime), "time %s, Node sent %s", e.Time(), want["time"])
		delete(got, "time")
		delete(want, "time")
		if src := want["source"]; nonASCII(src) {
			// A raw IRI is not a CloudEvents source (a URI-reference, RFC
			// 3986, ASCII); Node's SDK refuses it in strict mode. Our codec
			// accepts it, and the Go SDK's source (a URI) is its URI form,
			// the non-ASCII as percent-encoded UTF-8 (RFC 3987 §3.1): the
			// same resource, not byte for byte.
			want["source"] = iriToURI(t, src)
		}
		require.Equal(t, want, got, "Node's %s", sent.Attributes["id"])
		var d events.TripRequestedData
		require.NoError(t, events.DecodeData(e, &d))
		require.Equal(t, exp.Publish.Data, d)
		require.NoError(t, d.Request.Validate())
		require.Equal(t, sent.Attributes["id"], msg.Header.Get("Nats-Msg-Id"))
		for k, v := range msg.Header {
			if strings.HasPrefix(strings.ToLower(k), "ce-") {
				for _, c := range []byte(v[0]) {
					require.True(t, c > ' ' && c <= '~' && c != '"', "header %s=%q: not percent-encoded", k, v[0])
				}
			}
		}
	}
	require.True(t, nonASCII(rep.Sent[0].Attributes["subject"]) && nonASCII(rep.Sent[0].Attributes["partnername"]))
	require.True(t, nonASCII(rep.Sent[1].Attributes["source"]) && nonASCII(rep.Sent[1].Attributes["subject"]))
}

// iriToURI maps an IRI to its URI (RFC 3987 §3.1): every non-ASCII
// character as the percent-encoded octets of its UTF-8.
func iriToURI(t *testing.T, iri string) string {
	t.Helper()
	var b strings.Builder
	for _, c := range []byte(iri) {
		if c > 0x7e {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
