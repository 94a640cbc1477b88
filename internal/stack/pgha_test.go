package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestPGHAConfigRefusals(t *testing.T) {
	for _, bad := range []Config{
		{PGHA: true, DatabaseURL: "postgres://u@h/db"},
		{PGHA: true, PostgresClockOffset: time.Hour},
	} {
		bad.Dir = t.TempDir()
		_, err := Start(context.Background(), bad)
		require.ErrorContains(t, err, "PGHA", "%+v", bad)
	}
	_, err := (&Stack{}).FailOver(context.Background())
	require.ErrorIs(t, err, ErrNoPGHA)
}

// TestPGFailoverUnderLoad (issue 17 item 6): the whole system on a
// pg_auto_failover pair (Config.PGHA; replicas sharing the work through a
// failover are TestChaosPGFailover's).
// Every child's DATABASE_URL names both nodes with
// target_session_attrs=read-write. Trips are booked at a steady rate
// (one every 100 ms, each POST sent again
// with its Idempotency-Key until it is taken, as a client would) while
// the primary is killed with SIGKILL, keeper and postmaster; the monitor
// promotes the standby and the old primary rejoins as its standby.
// Booking goes on through it all. Then every trip must settle and be
// whole or empty by the companies' own records, with at most one charge
// line and one mail; the outboxes hold no event waiting or lost (outbox
// list --waiting, outbox verify); and every service process that lived
// through the failover took its liveness lock again on the new primary
// (its old session died with the old primary; meanwhile it fenced
// itself). The time from the kill
// until bookings resume is logged, not asserted.
func TestPGFailoverUnderLoad(t *testing.T) {
	testenv.PGAutoctl(t)
	dir := tempDir(t)
	var log syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{
		Dir: dir, Binary: binary, PGHA: true,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	t.Cleanup(func() {
		if t.Failed() { // the pair's and the services' logs, for the report
			_ = exec.Command("cp", "-r", dir, "/tmp/pgha-fail-"+time.Now().Format("150405")).Run()
		}
	})
	ha := s.PGHA()
	require.NotNil(t, ha)
	for _, name := range s.Instances() {
		if name == "sim" {
			continue
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.Pid(name)))
		require.NoError(t, err)
		var dbURL string
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
				dbURL = v
			}
		}
		require.Contains(t, dbURL, fmt.Sprintf("@127.0.0.1:%d,127.0.0.1:%d/", ha.NodePorts[0], ha.NodePorts[1]), "%s: both nodes", name)
		require.Contains(t, dbURL, "target_session_attrs=read-write", name)
	}
	pids := map[string]int{}
	for _, name := range s.Instances() {
		pids[name] = s.Pid(name)
	}

	card := "tok_pgha_" + strings.ToLower(ulid.Make().String()[16:])
	type posted struct {
		id    string
		taken time.Time // when the POST was accepted
	}
	var (
		mu    sync.Mutex
		trips []posted
	)
	stop := make(chan struct{})
	var booking sync.WaitGroup
	booking.Add(1)
	go func() { // a trip every 100 ms, each posted until it is taken
		defer booking.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		urls := s.URLs("trips")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			key := fmt.Sprintf("%s-%d", card, i)
			body := tripBody(card, fmt.Sprintf("pgha%d@example.com", i))
			for attempt := 0; ; attempt++ {
				id, err := book(ctx, urls[(i+attempt)%len(urls)], key, body)
				if err == nil {
					p := posted{id: id, taken: time.Now()}
					mu.Lock()
					trips = append(trips, p)
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
		return len(trips)
	}
	testenv.Eventually(t, func() bool { return booked() >= 20 }, "20 trips booked before the kill")

	// The failover runs on while the trips are booked and audited: it
	// returns once the old primary has rejoined as standby.
	first, err := ha.Primary(ctx)
	require.NoError(t, err)
	type result struct {
		f   pgcluster.Failover
		err error
	}
	logSize := map[string]int64{}
	for _, name := range s.Instances() {
		if fi, err := os.Stat(s.LogPath(name)); err == nil {
			logSize[name] = fi.Size()
		}
	}
	failedOver := make(chan result, 1)
	go func() {
		f, err := s.FailOver(ctx)
		failedOver <- result{f, err}
	}()
	var atPromotion int
	// Bounded waits only stop a hung test: on a machine at load 100 the
	// promotion and the bookings after it take minutes.
	waitFor(t, 5*time.Minute, func() bool {
		p, err := ha.Primary(ctx)
		atPromotion = booked()
		return err == nil && p != "" && p != first
	}, "the monitor promotes the standby")
	waitFor(t, 3*time.Minute, func() bool { return booked() >= atPromotion+30 }, "30 more trips booked once the standby is primary")
	close(stop)
	booking.Wait()

	mu.Lock()
	all := slices.Clone(trips)
	mu.Unlock()
	whole := 0
	for _, p := range all {
		status := settled(t, s.URL("trips"), p.id)
		o := judge(t, s, p.id, status, card)
		if o.Verdict == demo.Half || o.Charges > 1 || o.Mails != 1 {
			t.Errorf("trip %s: %+v", p.id, o)
		}
		if o.Verdict == demo.Whole {
			whole++
		}
	}

	res := <-failedOver
	require.NoError(t, res.err)
	f := res.f
	require.Equal(t, first, f.Killed)
	require.NotEqual(t, f.Killed, f.Promoted)
	primary, err := ha.Primary(ctx)
	require.NoError(t, err)
	require.Equal(t, f.Promoted, primary)
	// Bookings paused: the longest time after the kill with no POST
	// taken; they resumed at its end.
	var taken []time.Time
	before := 0
	for _, p := range all {
		if p.taken.Before(f.At) {
			before++
		} else {
			taken = append(taken, p.taken)
		}
	}
	slices.SortFunc(taken, func(a, b time.Time) int { return a.Compare(b) })
	var resumed, paused time.Duration
	last := f.At
	for _, tk := range taken {
		if gap := tk.Sub(last); gap > paused {
			paused, resumed = gap, tk.Sub(f.At)
		}
		last = tk
	}
	t.Logf("failover %s -> %s: writable again %s after the kill, the old primary rejoined as standby %s after it; "+
		"bookings paused %s and resumed %s after the kill; %d trips (%d taken before the kill): %d whole, %d empty",
		f.Killed, f.Promoted, f.Writable.Round(100*time.Millisecond), f.Rejoined.Round(100*time.Millisecond),
		paused.Round(100*time.Millisecond), resumed.Round(100*time.Millisecond), len(all), before, whole, len(all)-whole)

	// No event lost or stuck in an outbox: none waiting, and every one
	// published is in its stream.
	out, err := exec.CommandContext(ctx, binary, "outbox", "list", "--waiting", "--json", "--dir", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var waiting []json.RawMessage
	require.NoError(t, json.Unmarshal(out, &waiting), "%s", out)
	require.Empty(t, waiting, "no outbox event waiting")
	out, err = exec.CommandContext(ctx, binary, "outbox", "verify", "--json", "--dir", dir).CombinedOutput()
	require.NoError(t, err, "outbox verify: %s", out)
	var verified []struct {
		Service  string            `json:"service"`
		ReadBack int               `json:"read_back"`
		Lost     []json.RawMessage `json:"lost"`
	}
	require.NoError(t, json.Unmarshal(out, &verified), "%s", out)
	read := 0
	for _, v := range verified {
		require.Empty(t, v.Lost, "%s lost no published event", v.Service)
		read += v.ReadBack
	}
	require.Positive(t, read, "published events were read back: %s", out)

	// The liveness lock died with the old primary's session: each replica
	// that lived through the failover took it again on the new primary
	// (until then it was fenced, starting no company call).
	var restarted, fenced []string
	for _, name := range s.Instances() {
		if p := s.processOf(name); p == "sim" || p == "reconciler" { // no liveness lock
			continue
		}
		if s.Pid(name) != pids[name] {
			restarted = append(restarted, name)
			continue
		}
		logb, err := os.ReadFile(s.LogPath(name))
		require.NoError(t, err)
		logb = logb[logSize[name]:] // since the failover began
		require.Contains(t, string(logb), "liveness: lock taken again", "%s took its liveness lock again after the failover", name)
		if strings.Contains(string(logb), "starting no company call until one is") {
			fenced = append(fenced, name)
		}
	}
	t.Logf("service replicas restarted by the supervisor during the failover: %v; fenced until their lock was taken again: %v", restarted, fenced)
	require.Contains(t, log.String(), "PostgreSQL failed over")
}

// waitFor polls cond every 50 ms until it holds, failing the test with
// msg after bound (which only stops a hung test).
func waitFor(t *testing.T, bound time.Duration, cond func() bool, msg string) {
	t.Helper()
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("condition never held within %s: %s", bound, msg)
}
