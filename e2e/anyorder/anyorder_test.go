// Package anyorder starts the system as a person does who follows the
// process model by hand (docs/contracts/trips-api.md): on a fresh NATS
// server and a fresh database, one `tripsaga serve <process>` at a time,
// each only once the one before answers /readyz 200, in several orders,
// with and without the reconciler; nobody creates the streams beforehand.
package anyorder

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const operatorToken = "tok-any-order"

// system is one fresh NATS server and database, and the processes started
// on them so far.
type system struct {
	t     *testing.T
	bin   string
	srv   *server.Server
	roles map[string]string
	logs  string
	addr  map[string]string // process -> host:port
	lns   map[string]*net.TCPListener
}

// processes are every process a system may run, the simulators first.
var processes = []string{"sim", "hotel", "payment", "car", "trips", "reconciler"}

func newSystem(t *testing.T, bin string) *system {
	t.Helper()
	s := &system{t: t, bin: bin, srv: testenv.NATS(t), logs: t.TempDir(), addr: map[string]string{}, lns: map[string]*net.TCPListener{}}
	s.roles = testenv.Roles(t, testenv.Postgres(t))
	// Each process's socket is made here and handed to it (as up does),
	// so every address is known before any process starts.
	for _, p := range processes {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		s.lns[p] = l.(*net.TCPListener)
		s.addr[p] = l.Addr().String()
	}
	return s
}

func (s *system) url(p string) string { return "http://" + s.addr[p] }

func (s *system) env(p string) []string {
	sim := s.url("sim")
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"NATS_URL=" + s.srv.ClientURL(), "DATABASE_URL=" + s.roles[p], "HTTP_ADDR=" + s.addr[p], process.ListenFDEnv + "=3",
		"STEPS=hotel,payment,car", "TRIPSAGA_INSTANCE=" + p,
		"HOTEL_URL=" + sim + "/hotel", "PAYMENTS_URL=" + sim + "/payments", "CARS_URL=" + sim + "/cars", "MAIL_URL=" + sim + "/mail",
		"SERVICE_URLS=trips=" + s.url("trips") + ",hotel=" + s.url("hotel") + ",payment=" + s.url("payment") + ",car=" + s.url("car"),
	}
	if p != "sim" {
		env = append(env, natsauth.EnvCreds+"="+testenv.Creds(s.t, s.srv, p))
	}
	if p == "reconciler" {
		env = append(env, reconciler.OperatorTokenEnv+"="+operatorToken)
	}
	return env
}

// start starts `tripsaga serve p` and waits until its /readyz answers
// 200; it returns that answer's body.
func (s *system) start(p string) string {
	t := s.t
	t.Helper()
	logf, err := os.Create(filepath.Join(s.logs, p+".log"))
	require.NoError(t, err)
	f, err := s.lns[p].File()
	require.NoError(t, err)
	cmd := exec.Command(s.bin, "serve", p)
	cmd.Env = s.env(p)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	f.Close()
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Logf("==== %s log (tail)\n%s", p, b)
		}
	})
	began := time.Now()
	deadline := began.Add(90 * time.Second)
	for {
		code, body := s.readyz(p)
		if code == http.StatusOK {
			t.Logf("%s ready %s after its start; /readyz:\n%s", p, time.Since(began).Round(time.Millisecond), body)
			return body
		}
		select {
		case <-exited:
			t.Fatalf("%s exited before it was ready (last /readyz: %d %s)", p, code, body)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became ready: /readyz %d %s", p, code, body)
		}
	}
}

// readyz returns the status and body of p's GET /readyz (0 when it does
// not answer).
func (s *system) readyz(p string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url(p)+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// book books five trips through trips and checks each ends confirmed,
// whole by the companies' own records, with one mail.
func (s *system) book() {
	t := s.t
	t.Helper()
	sim := s.url("sim")
	env := &demo.Env{
		TripsURL: s.url("trips"), PaymentURL: s.url("payment"),
		HotelURL: sim + "/hotel", PaymentsURL: sim + "/payments", CarsURL: sim + "/cars", MailURL: sim + "/mail",
	}
	o := demo.SituationsWith(false)[0].Run(context.Background(), env) // five trips, nothing wrong
	b, _ := json.MarshalIndent(o, "", "  ")
	require.Truef(t, o.OK, "outcome:\n%s", b)
	require.Len(t, o.Trips, 5)
	for _, tr := range o.Trips {
		require.Equal(t, "confirmed", tr.Status, "%s", b)
		require.Equal(t, demo.Whole, tr.Verdict, "%s", b)
		require.Equal(t, 1, tr.Mails, "%s", b)
	}
}

// waitsFor is the line /readyz prints for consumer waiting for stream.
func waitsFor(stream, consumer string) string {
	return "waiting for stream " + stream + " (created by " + events.Default.StreamOwner(stream) + " at its start, or by tripsaga streams apply): consumer " + consumer + " consumes it once it appears"
}

// TestStartInAnyOrder starts the processes one at a time on a fresh NATS
// server and database, in three orders (one without a reconciler), and
// books trips once all are up: every process becomes ready whatever runs
// before it, says on /readyz which streams it waits for (and stops saying
// so once they appear), and the trips end whole by the companies'
// records. Then, on the system with a reconciler, the OPERATOR stream is
// deleted: no process becomes unready, the reconciler creates it again by
// itself, and an operator's action is carried out.
func TestStartInAnyOrder(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tripsaga")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/tripsaga")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	require.NoError(t, build.Run())

	t.Run("hotel first, trips last, no reconciler", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t, bin)
		s.start("sim")
		body := s.start("hotel")
		for _, st := range []string{events.StreamTrips, events.StreamPayment, events.StreamOperator} {
			require.Contains(t, body, waitsFor(st, "hotel"), "hotel is ready and says what it waits for")
		}
		body = s.start("payment")
		require.Contains(t, body, waitsFor(events.StreamCar, "payment"))
		s.start("car")
		s.start("trips")
		s.book()
		// Only the reconciler creates OPERATOR: without one, every
		// service stays ready and says it waits for it.
		for _, p := range []string{"hotel", "payment", "car", "trips"} {
			code, body := s.readyz(p)
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, waitsFor(events.StreamOperator, p))
			require.NotContains(t, body, "waiting for stream "+events.StreamTrips)
			require.NotContains(t, body, "waiting for stream "+events.StreamPayment)
		}
	})

	t.Run("car first, reconciler before hotel, payment last", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t, bin)
		s.start("sim")
		body := s.start("car")
		require.Contains(t, body, waitsFor(events.StreamPayment, "car"))
		s.start("trips")
		body = s.start("reconciler")
		require.Contains(t, body, waitsFor(events.StreamHotel, reconciler.ProjectionName))
		s.start("hotel")
		s.start("payment")
		s.book()
	})

	t.Run("reconciler first, trips next, hotel last; then OPERATOR is lost", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t, bin)
		s.start("sim")
		s.start("reconciler")
		s.start("trips")
		s.start("car")
		s.start("payment")
		s.start("hotel")
		booked := time.Now()
		s.book()
		t.Logf("five trips booked and judged in %s", time.Since(booked).Round(time.Millisecond))
		services := []string{"hotel", "payment", "car", "trips", "reconciler"}
		for _, p := range services {
			_, body := s.readyz(p)
			// Every service listens to the INSURANCE stream too (a trip
			// of a version with insurance may come, events.Version), which
			// only the insurance service makes: not run here.
			for line := range strings.SplitSeq(body, "\n") {
				if strings.HasPrefix(line, "waiting for stream ") && !strings.HasPrefix(line, "waiting for stream "+events.StreamInsurance+" ") {
					t.Fatalf("%s: every stream of its steps exists, but /readyz says %q", p, line)
				}
			}
		}

		// The OPERATOR stream is deleted under the running system.
		ctx := context.Background()
		js, err := jetstream.New(testenv.Connect(t, s.srv, natsauth.Admin))
		require.NoError(t, err)
		st, err := js.Stream(ctx, events.StreamOperator)
		require.NoError(t, err)
		created := st.CachedInfo().Created
		require.NoError(t, js.DeleteStream(ctx, events.StreamOperator))
		deleted := time.Now()
		stayReady := func() {
			for _, p := range services {
				code, body := s.readyz(p)
				require.Equal(t, http.StatusOK, code, "%s stays ready while OPERATOR is lost: %s", p, body)
			}
		}
		// It comes back by itself: the reconciler, its owner, creates it
		// again (no action was posted, no process restarted).
		testenv.Eventually(t, func() bool {
			stayReady()
			st, err := js.Stream(ctx, events.StreamOperator)
			return err == nil && st.CachedInfo().Created.After(created)
		}, "the reconciler creates the OPERATOR stream again")
		t.Logf("OPERATOR back %s after its deletion", time.Since(deleted).Round(time.Millisecond))
		acted := time.Now()

		// An operator's action goes through it and is carried out.
		trip := s.anyTrip()
		s.act(map[string]string{"action": events.ActionPause, "trip": trip, "service": "hotel", "reason": "any-order test", "operator": "tester"})
		testenv.Eventually(t, func() bool {
			stayReady()
			var v struct {
				Paused bool `json:"paused"`
			}
			return getJSON(s.url("hotel")+"/operator/"+trip, &v) == nil && v.Paused
		}, "hotel carries out the pause through the recreated OPERATOR stream")
		t.Logf("the pause carried out by hotel %s after it was posted", time.Since(acted).Round(time.Millisecond))
	})
}

// anyTrip returns the id of a trip the trips service recorded.
func (s *system) anyTrip() string {
	var v struct {
		Items []struct {
			TripID string `json:"trip_id"`
		} `json:"items"`
	}
	require.NoError(s.t, getJSON(s.url("trips")+"/trips", &v))
	require.NotEmpty(s.t, v.Items)
	return v.Items[0].TripID
}

// act posts an operator's action to the reconciler and requires 202.
func (s *system) act(a map[string]string) {
	b, _ := json.Marshal(a)
	req, err := http.NewRequest(http.MethodPost, s.url("reconciler")+"/api/actions", strings.NewReader(string(b)))
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	req.Header.Set("Idempotency-Key", "any-order-"+a["action"]+"-"+a["trip"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(s.t, http.StatusAccepted, resp.StatusCode, "%s", body)
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
