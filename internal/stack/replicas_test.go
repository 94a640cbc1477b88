package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

func TestInstanceNamesAndPorts(t *testing.T) {
	require.Equal(t, "hotel", InstanceName("hotel", 1))
	require.Equal(t, "hotel-2", InstanceName("hotel", 2))
	require.Equal(t, "nats-1", InstanceName("nats", 1))

	// Replica 1 keeps today's layout; the rest follow.
	ports := Ports(Config{BasePort: 7400, Replicas: 2, NATSCluster: 3})
	want := []Port{
		{7400, "NATS"}, {7401, "sim"}, {7402, "hotel"}, {7403, "payment"}, {7404, "car"}, {7405, "trips"}, {7406, "reconciler"},
		{7407, "hotel-2"}, {7408, "payment-2"}, {7409, "car-2"}, {7410, "trips-2"}, {7411, "reconciler-2"},
		{7412, "nats-2"}, {7413, "nats-3"},
		{7414, "nats-1 routes"}, {7415, "nats-2 routes"}, {7416, "nats-3 routes"},
		{7417, "nats-1 health"}, {7418, "nats-2 health"}, {7419, "nats-3 health"},
	}
	require.Equal(t, want, ports)
	require.Len(t, Ports(Config{BasePort: 7400}), 1+len(Processes))

	for _, bad := range []Config{{Replicas: -1}, {NATSCluster: 2}} {
		bad.Dir = t.TempDir()
		_, err := Start(context.Background(), bad)
		require.Error(t, err, "%+v", bad)
	}
}

// tripBody is a valid trip paid with card.
func tripBody(card, email string) []byte {
	day := time.Now().AddDate(0, 0, 30)
	return fmt.Appendf(nil, `{"traveler":{"name":"Ada Example","email":%q},"hotel":{"property_id":"P-100","check_in":%q,"nights":2},"car":{"car_class":"compact","pickup":%q,"return":%q},"payment":{"card_token":%q,"amount_cents":33000,"currency":"USD"}}`,
		email, day.Format(time.DateOnly), day.Format(time.DateOnly), day.AddDate(0, 0, 2).Format(time.DateOnly), card)
}

// book posts a trip to base with Prefer: wait=0 and an Idempotency-Key,
// and returns its id; "" when the answer was not 201/202 (a caller may post
// again with the same key).
func book(ctx context.Context, base, key string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/trips", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Prefer", "wait=0")
	req.Header.Set("Idempotency-Key", key)
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var tr struct {
		TripID string `json:"trip_id"`
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("POST /trips: %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		return "", err
	}
	return tr.TripID, nil
}

func getJSON(u string, v any) (int, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if v != nil {
		_ = json.NewDecoder(resp.Body).Decode(v)
	}
	return resp.StatusCode, nil
}

// settled polls GET /trips/{id} on base until the trip is confirmed or
// canceled (the bounded wait only stops a hung test) and returns its
// status.
func settled(t *testing.T, base, id string) string {
	t.Helper()
	var status string
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var tr struct {
			Status string `json:"status"`
		}
		if code, err := getJSON(base+"/trips/"+url.PathEscape(id), &tr); err == nil && code == http.StatusOK {
			status = tr.Status
			if status == "confirmed" || status == "canceled" {
				return status
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("trip %s never settled (last status %q)", id, status)
	return ""
}

// judge reads the companies' own records of a settled trip paid with card
// (hold, charge, booking, the card's statement lines, the mails) and
// returns them with demo.Verdict's judgement.
func judge(t *testing.T, s *Stack, id, status, card string) demo.TripOutcome {
	t.Helper()
	urls := s.CompanyURLs()
	o := demo.TripOutcome{TripID: id, Status: status}
	rec := func(base, res, key string) string {
		var v struct {
			Status string `json:"status"`
		}
		code, err := getJSON(base+"/"+res+"/"+url.PathEscape(key), &v)
		switch {
		case err != nil:
			return "error"
		case code == http.StatusNotFound:
			return "none"
		}
		return v.Status
	}
	o.Hold = rec(urls["HOTEL_URL"], "holds", id+":hotel")
	o.Charge = rec(urls["PAYMENTS_URL"], "charges", id+":charge")
	o.Booking = rec(urls["CARS_URL"], "bookings", id+":car")
	var st struct {
		Lines []struct {
			TripID string `json:"trip_id"`
			Kind   string `json:"kind"`
		} `json:"lines"`
	}
	_, err := getJSON(urls["PAYMENTS_URL"]+"/statements/"+url.PathEscape(card), &st)
	require.NoError(t, err)
	for _, l := range st.Lines {
		if l.TripID != id {
			continue
		}
		switch l.Kind {
		case "charge":
			o.Charges++
		case "refund":
			o.Refunds++
		}
	}
	// The mail goes out just after the trip settles: wait for it.
	testenv.Eventually(t, func() bool {
		var msgs struct {
			Items []any `json:"items"`
		}
		if _, err := getJSON(urls["MAIL_URL"]+"/messages?trip_id="+url.QueryEscape(id), &msgs); err != nil {
			return false
		}
		o.Mails = len(msgs.Items)
		return o.Mails > 0
	}, "the mail of trip %s", id)
	o.Verdict = demo.Verdict(o)
	return o
}

// TestReplicas (issue 6 item 1): a stack with two replicas of every
// service starts, every replica answers /readyz on its own port, with its
// own log and its instance name, a replica of payment killed with SIGKILL
// comes back, and a trip booked through the second trips replica settles
// whole.
func TestReplicas(t *testing.T) {
	dir := tempDir(t)
	var log syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{
		Dir: dir, Binary: binary, Replicas: 2,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	require.NoError(t, err)
	t.Cleanup(s.Stop)

	var want []string
	want = append(want, "sim")
	for _, p := range Services {
		want = append(want, p, p+"-2")
	}
	require.Equal(t, want, s.Instances())
	addrs := map[string]string{}
	for _, name := range s.Instances() {
		require.NoError(t, s.WaitReady(ctx, name))
		if other, ok := addrs[s.Addr[name]]; ok {
			t.Fatalf("%s and %s share %s", name, other, s.Addr[name])
		}
		addrs[s.Addr[name]] = name
		if _, err := os.Stat(s.LogPath(name)); err != nil {
			t.Fatalf("log of %s: %v", name, err)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.Pid(name)))
		require.NoError(t, err)
		if !slices.Contains(strings.Split(string(environ), "\x00"), InstanceEnv+"="+name) {
			t.Fatalf("%s was not told its instance name (%s)", name, InstanceEnv)
		}
	}
	trips := s.URLs("trips")
	require.Equal(t, []string{s.URL("trips"), s.URL("trips-2")}, trips)
	require.Equal(t, []string{s.URL("sim")}, s.URLs("sim"))
	env, err := ReadEnvFile(dir)
	require.NoError(t, err)
	require.Equal(t, s.URL("trips"), env["TRIPS_URL"])
	require.Equal(t, strings.Join(trips, ","), env["TRIPS_URLS"])

	old := s.Pid("payment-2")
	pid, err := s.Kill("payment-2")
	require.NoError(t, err)
	require.Equal(t, old, pid)
	require.NoError(t, s.WaitReady(ctx, "payment-2"))
	require.NotEqual(t, old, s.Pid("payment-2"), "payment-2 was not started again")
	require.Contains(t, log.String(), "process=payment-2")

	card := "tok_replicas_" + strings.ToLower(ulid.Make().String()[16:])
	var id string
	testenv.Eventually(t, func() bool {
		id, err = book(ctx, trips[1], "replicas-"+card, tripBody(card, "replicas@example.com"))
		return err == nil && id != ""
	}, "POST /trips through trips-2 accepted")
	// Asked through the first replica: the projection lives in PostgreSQL.
	status := settled(t, trips[0], id)
	o := judge(t, s, id, status, card)
	require.Equal(t, demo.Whole, o.Verdict, "%+v", o)
	require.Equal(t, 1, o.Mails, "%+v", o)
}

// TestNATSClusterNodeKilled (issue 6 item 2, issue 17 item 8): on a
// three-node JetStream cluster (streams at 3 replicas), trips are booked at
// a steady rate while every event stream's leader steps down, then one
// durable consumer's leader of each stream, and then the node that leads
// them is killed with SIGKILL and restarted by the supervisor with its
// store emptied (a lost disk), until it has caught up. Every trip ends
// whole or empty by the companies' own records, nothing is doubled (one
// charge line at most, one mail), `tripsaga outbox verify` finds no
// published event missing from its stream, and the services reconnected
// on their own (same pids).
func TestNATSClusterNodeKilled(t *testing.T) {
	dir := tempDir(t)
	var log syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute) // only a bound against a hang: a loaded machine starts the cluster slowly
	defer cancel()
	s, err := Start(ctx, Config{
		Dir: dir, Binary: binary, NATSCluster: 3,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	require.NoError(t, err)
	t.Cleanup(s.Stop)

	require.Equal(t, []string{"nats-1", "nats-2", "nats-3"}, s.Instances()[:3])
	require.Len(t, strings.Split(s.NATSURL, ","), 3)
	require.Equal(t, 3, s.StreamReplicas())
	nc, err := s.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, name := range []string{events.StreamTrips, events.StreamDeadLetter} {
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		require.Equal(t, 3, st.CachedInfo().Config.Replicas, "stream %s", name)
	}
	// A stream left at one replica is raised to the replicas asked for;
	// one process asking for fewer (a tool without STREAM_REPLICAS) never
	// shrinks them.
	dl, err := js.Stream(ctx, events.StreamDeadLetter)
	require.NoError(t, err)
	cfg := dl.CachedInfo().Config
	cfg.Replicas = 1
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, process.EnsureStreams(ctx, js, events.Default, natsauth.Admin, 3, 30*time.Second))
	require.NoError(t, events.EnsureStreamsReplicas(ctx, js, events.Default, 1))
	dl, err = js.Stream(ctx, events.StreamDeadLetter)
	require.NoError(t, err)
	require.Equal(t, 3, dl.CachedInfo().Config.Replicas, "DEADLETTER raised from 1 to 3 replicas, and kept there")

	pids := map[string]int{}
	for _, name := range s.Instances() {
		if !strings.HasPrefix(name, "nats-") {
			pids[name] = s.Pid(name)
		}
	}

	card := "tok_cluster_" + strings.ToLower(ulid.Make().String()[16:])
	var (
		mu  sync.Mutex
		ids []string
	)
	stop := make(chan struct{})
	var booking sync.WaitGroup
	booking.Add(1)
	go func() { // a trip every 100 ms, each posted until it is taken
		defer booking.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			key := fmt.Sprintf("%s-%d", card, i)
			body := tripBody(card, fmt.Sprintf("cluster%d@example.com", i))
			for {
				id, err := book(ctx, s.URL("trips"), key, body)
				if err == nil {
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
					break
				}
				if ctx.Err() != nil {
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	booked := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ids)
	}
	testenv.Eventually(t, func() bool { return booked() >= 20 }, "20 trips booked before the leaders change")

	// Every event stream's leader steps down, then one durable consumer's
	// leader of each, while trips are booked; each is waited on until
	// another node leads it. Every JetStream API request has a bound of
	// its own and is asked again when it times out (jsAsk): the API may
	// leave a request unanswered while leaders move, and a request bound
	// only by the test's context waited for all of it.
	api := &jsAPI{t: t, ctx: ctx}
	eventStreams := ask(api, "the stream names", func(rctx context.Context) ([]string, error) {
		var out []string
		names := js.StreamNames(rctx)
		for n := range names.Name() {
			if n != events.StreamDeadLetter && n != events.StreamOperator {
				out = append(out, n)
			}
		}
		return out, names.Err()
	})
	slices.Sort(eventStreams)
	require.Contains(t, eventStreams, events.StreamTrips)
	stepDowns := 0
	for _, name := range eventStreams {
		api.stepDown(nc, "$JS.API.STREAM.LEADER.STEPDOWN."+name, "stream "+name, func(rctx context.Context) (string, error) {
			info, err := js.Stream(rctx, name)
			if err != nil || info.CachedInfo().Cluster == nil {
				return "", err
			}
			return info.CachedInfo().Cluster.Leader, nil
		})
		stepDowns++
		consumers := ask(api, "the consumers of "+name, func(rctx context.Context) ([]string, error) {
			st, err := js.Stream(rctx, name)
			if err != nil {
				return nil, err
			}
			var out []string
			cn := st.ConsumerNames(rctx)
			for c := range cn.Name() {
				out = append(out, c)
			}
			return out, cn.Err()
		})
		if len(consumers) == 0 {
			continue
		}
		slices.Sort(consumers)
		api.stepDown(nc, "$JS.API.CONSUMER.LEADER.STEPDOWN."+name+"."+consumers[0], "consumer "+name+"/"+consumers[0], func(rctx context.Context) (string, error) {
			c, err := js.Consumer(rctx, name, consumers[0])
			if err != nil || c.CachedInfo().Cluster == nil {
				return "", err
			}
			return c.CachedInfo().Cluster.Leader, nil
		})
		stepDowns++
	}
	atStepDowns := booked()
	t.Logf("%d leaders stepped down (%d event streams, one consumer of each), %d trips booked by then; %d JetStream API requests unanswered and asked again",
		stepDowns, len(eventStreams), atStepDowns, api.retried)
	testenv.Eventually(t, func() bool { return booked() >= atStepDowns+10 }, "10 more trips booked after the step-downs")
	// No service stalled behind a leader that moved: every replica's
	// /readyz answers ready, which fails while an inbox has messages
	// waiting and none arrived for 2×AckWait (inbox.Inbox.Check), or
	// while its NATS or PostgreSQL does not answer.
	for name := range pids {
		require.NoError(t, s.WaitReady(ctx, name), "%s after the step-downs", name)
	}

	// The event streams' leaders moved to nats-2, the node to be killed
	// (best effort: a step-down is refused while a peer catches up), so
	// that its death forces elections while trips are in flight.
	var led []string
	for _, name := range []string{events.StreamTrips, events.StreamHotel, events.StreamPayment, events.StreamCar} {
		for try := 0; try < 20; try++ {
			rctx, rcancel := context.WithTimeout(ctx, jsRequestTimeout)
			st, err := js.Stream(rctx, name)
			rcancel()
			if err == nil && st.CachedInfo().Cluster != nil && st.CachedInfo().Cluster.Leader == "nats-2" {
				led = append(led, name)
				break
			}
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, []byte(`{"placement":{"preferred":"nats-2"}}`), jsRequestTimeout)
			time.Sleep(250 * time.Millisecond)
		}
	}
	t.Logf("streams led by nats-2 when it is killed: %v", led)
	old := s.Pid("nats-2")
	_, err = s.KillEmptyStore("nats-2")
	require.NoError(t, err)
	atKill := booked()
	// Ready means in the cluster with its streams and consumers current:
	// caught up from its peers from nothing.
	require.NoError(t, s.WaitReady(ctx, "nats-2"))
	require.NotEqual(t, old, s.Pid("nats-2"))
	t.Logf("nats-2 restarted with an empty store and caught up; %d trips booked by then (%d at the kill)", booked(), atKill)
	testenv.Eventually(t, func() bool { return booked() >= atKill+30 }, "30 more trips booked after the kill")
	close(stop)
	booking.Wait()

	mu.Lock()
	all := slices.Clone(ids)
	mu.Unlock()
	whole := 0
	for _, id := range all {
		status := settled(t, s.URL("trips"), id)
		o := judge(t, s, id, status, card)
		if o.Verdict == demo.Half || o.Charges > 1 || o.Mails != 1 {
			t.Errorf("trip %s: %+v", id, o)
		}
		if o.Verdict == demo.Whole {
			whole++
		}
	}
	t.Logf("%d trips (%d booked before the kill): %d whole, %d empty", len(all), atKill, whole, len(all)-whole)
	for name, pid := range pids {
		require.Equal(t, pid, s.Pid(name), "%s was restarted: it should have reconnected to the cluster by itself", name)
	}
	require.Contains(t, log.String(), "process=nats-2")

	// No published event is missing from its stream: the outbox's own
	// check, as an operator runs it.
	// A read of it that times out (an election still settling on a loaded
	// machine) fails the run without marking anything: it is run again.
	out := ask(api, "tripsaga outbox verify", func(context.Context) ([]byte, error) { // its own reads are bounded (the client's 5 s)
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, binary, "outbox", "verify", "--dir", dir, "--json")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			if e := stderr.String(); strings.Contains(e, "timeout") || strings.Contains(e, "temporarily unavailable") {
				return nil, fmt.Errorf("%w: %s", nats.ErrTimeout, e)
			}
			return nil, fmt.Errorf("%w: %s%s", err, stdout.Bytes(), stderr.Bytes())
		}
		return stdout.Bytes(), nil
	})
	var verified []struct {
		Service  string `json:"service"`
		ReadBack int    `json:"read_back"`
		Lost     []any  `json:"lost"`
	}
	require.NoError(t, json.Unmarshal(out, &verified), "%s", out)
	readBack := 0
	for _, v := range verified {
		require.Empty(t, v.Lost, "events of %s's outbox lost by their streams", v.Service)
		readBack += v.ReadBack
	}
	require.Positive(t, readBack, "events read back: %s", out)
	t.Logf("outbox verify: %d events read back from their streams, 0 lost", readBack)
}

// jsRequestTimeout bounds one JetStream API request of the tests here.
// The API leaves a request unanswered at times while leaders move ("API
// requests may time out during leader elections", NATS's JetStream
// clustering docs); the jetstream client bounds a request by its 5 s
// default only when the context has no deadline, so without a bound of
// its own a request waits for the whole test's context (the 6-minute
// guard a CI run once hit listing a stream's consumers). 10 s, not the
// client's 5 s, for a server on a machine at load 10 and more.
const jsRequestTimeout = 10 * time.Second

// jsAPI asks the JetStream API on behalf of a test: each request bounded
// by jsRequestTimeout, asked again while it fails for a reason that
// passes (see [jsPasses]), for at most jsAPIWait in all.
type jsAPI struct {
	t       *testing.T
	ctx     context.Context
	retried int // requests asked again
}

// jsAPIWait bounds the asking for one answer: only against a hang (a
// loaded machine's cluster answers "JetStream system temporarily
// unavailable" for a minute and more at times).
const jsAPIWait = 3 * time.Minute

// ask calls f with a context bounded by jsRequestTimeout until it
// answers, asking again while its error passes ([jsPasses]); another
// error, or no answer within jsAPIWait, fails the test naming what.
func ask[T any](a *jsAPI, what string, f func(context.Context) (T, error)) T {
	a.t.Helper()
	deadline := time.Now().Add(jsAPIWait)
	for {
		rctx, cancel := context.WithTimeout(a.ctx, jsRequestTimeout)
		v, err := f(rctx)
		cancel()
		switch {
		case err == nil:
			return v
		case !jsPasses(err) || a.ctx.Err() != nil:
			a.t.Fatalf("%s: %v", what, err)
		case time.Now().After(deadline):
			a.t.Fatalf("%s: no answer in %s, asked %d times (last: %v)", what, jsAPIWait, a.retried, err)
		}
		a.retried++
		time.Sleep(100 * time.Millisecond)
	}
}

// jsPasses reports whether err is one the JetStream API gives while a
// leader is being elected: no answer in time, no responders yet, or a
// 503 ("JetStream system temporarily unavailable", a stream or consumer
// without a leader) or 408.
func jsPasses(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == http.StatusServiceUnavailable || apiErr.Code == http.StatusRequestTimeout
	}
	return false
}

// stepDown asks the JetStream API for a leader step-down at subject, of
// the stream or consumer whose leader leader reads, and waits until
// another node leads it. The step-down names another node as preferred
// (nats-server 2.11's placement), so the old leader is not elected again;
// it is asked again while the cluster refuses it (a peer still catching
// up after the last election), leaves it unanswered, or the leader has
// not changed 5 s after. Each request, the leader's reads included, has
// its own bound (jsRequestTimeout).
func (a *jsAPI) stepDown(nc *nats.Conn, subject, what string, leader func(context.Context) (string, error)) {
	t := a.t
	t.Helper()
	before := ask(a, "leader of "+what, func(rctx context.Context) (string, error) {
		l, err := leader(rctx)
		if err == nil && l == "" {
			return "", fmt.Errorf("%s has no leader yet: %w", what, nats.ErrTimeout)
		}
		return l, err
	})
	n, _ := strconv.Atoi(strings.TrimPrefix(before, "nats-"))
	preferred := InstanceName("nats", n%3+1)
	var last string
	var asked time.Time
	deadline := time.Now().Add(jsAPIWait)
	for !func() bool {
		rctx, cancel := context.WithTimeout(a.ctx, jsRequestTimeout)
		now, err := leader(rctx)
		cancel()
		if err == nil && now != "" && now != before {
			return true
		}
		if err != nil {
			last = "reading the leader: " + err.Error()
			if !jsPasses(err) {
				t.Fatalf("leader of %s: %v", what, err)
			}
			a.retried++
		}
		if time.Since(asked) < 5*time.Second {
			return false
		}
		asked = time.Now()
		msg, err := nc.Request(subject, fmt.Appendf(nil, `{"placement":{"preferred":%q}}`, preferred), jsRequestTimeout)
		if err != nil {
			last = err.Error()
			a.retried++
			return false
		}
		last = string(msg.Data)
		// The preferred node (not the old leader) leads already: an
		// election happened, and the leader read above lagged behind it.
		return strings.Contains(last, "is already leader")
	}() {
		if time.Now().After(deadline) {
			t.Fatalf("%s still led by %s after %s of step-downs (last answer %s)", what, before, jsAPIWait, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
