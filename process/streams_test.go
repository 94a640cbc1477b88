package process

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestStreamsOfAProcess opens the hotel process on a fresh server, as its
// own identity, with an inbox on TRIPS, which nobody has created: it is
// ready and /readyz names the stream it waits for. Its own stream HOTEL,
// and DEADLETTER, deleted under it, make it unready (HOTEL only) until its
// keeper creates them again; OPERATOR, the reconciler's own, never makes
// the reconciler unready.
func TestStreamsOfAProcess(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := testenv.NATS(t)
	roles := testenv.Roles(t, testenv.Postgres(t))
	admin, err := jetstream.New(testenv.Connect(t, srv, natsauth.Admin))
	require.NoError(t, err)
	open := func(name string) (*Process, string) {
		env := Env{HTTPAddr: freeAddr(t), NATSURL: srv.ClientURL(), NATSClient: testenv.Client(t, srv, name), DatabaseURL: roles[name]}
		p, err := Open(ctx, name, name, env, true, tripsql.SetSaga)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p, "http://" + env.HTTPAddr + "/readyz"
	}
	p, readyz := open("hotel")
	in, err := inbox.New(inbox.Config{
		Name: "hotel", Stream: events.StreamTrips, FilterSubjects: []string{"trip.requested.>"}, Types: []string{events.TripRequested},
		Pool: p.Pool, JetStream: p.JS, Handler: func(context.Context, pgx.Tx, event.Event) error { return nil },
	})
	require.NoError(t, err)
	p.AddInboxes(func() []*inbox.Inbox { return []*inbox.Inbox{in} })
	p.SetReady()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- p.Serve(sctx) }()
	go func() { done <- in.Run(sctx) }()
	t.Cleanup(func() {
		stop()
		<-done //nolint:errcheck // stopping: the test checked the serving
		<-done //nolint:errcheck // stopping: the test checked the serving
	})
	testenv.Eventually(t, func() bool {
		resp, err := http.Get(readyz)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, "hotel is ready without TRIPS")
	a := get(t, http.MethodGet, readyz)
	require.Equal(t, http.StatusOK, a.code, a.body)
	require.Contains(t, a.body, "waiting for stream TRIPS (created by trips at its start, or by tripsaga streams apply): consumer hotel consumes it once it appears")

	// The keeper is stopped, so the loss is seen; then one that looks
	// every 50 ms brings the streams back.
	p.stopKeeper()
	p.keeper.Wait()
	created := map[string]time.Time{}
	for _, s := range []string{events.StreamHotel, events.StreamDeadLetter} {
		st, err := admin.Stream(ctx, s)
		require.NoError(t, err)
		created[s] = st.CachedInfo().Created
		require.NoError(t, admin.DeleteStream(ctx, s))
	}
	a = get(t, http.MethodGet, readyz)
	require.Equal(t, http.StatusServiceUnavailable, a.code, a.body)
	require.Contains(t, a.body, "stream HOTEL (hotel's own) does not exist; hotel creates it again within 2s")
	kctx, kstop := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() { p.keepStreams(kctx, 1, 50*time.Millisecond); close(kept) }()
	t.Cleanup(func() { kstop(); <-kept })
	testenv.Eventually(t, func() bool {
		for s, at := range created {
			st, err := admin.Stream(ctx, s)
			if err != nil || !st.CachedInfo().Created.After(at) {
				return false
			}
		}
		return get(t, http.MethodGet, readyz).code == http.StatusOK
	}, "HOTEL and DEADLETTER are created again by the hotel itself, and it is ready again")

	r, _ := open("reconciler")
	require.NoError(t, r.checkOwnStreams(ctx))
	require.NoError(t, admin.DeleteStream(ctx, events.StreamOperator))
	require.NoError(t, r.checkOwnStreams(ctx), "OPERATOR never makes a process unready, its owner's included")
	testenv.Eventually(t, func() bool {
		_, err := admin.Stream(ctx, events.StreamOperator)
		return err == nil
	}, "the reconciler creates OPERATOR again by itself")
}
