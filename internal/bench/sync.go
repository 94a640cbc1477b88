package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// SyncResult is the cost of the store's sync policy (internal/natssync)
// and of the outbox's verify, measured in one run on two scratch NATS
// servers, one syncing always (the policy), one at nats-server's default
// (every 2 minutes), on the same disk.
type SyncResult struct {
	// PublishAlwaysPerS and PublishDefaultPerS: JetStream asynchronous
	// publishes of 512 B per second for 3 s (as baseline B; less when baseline B is shorter), counted by
	// PubAcks, on each server.
	PublishAlwaysPerS  float64 `json:"publish_always_per_s"`
	PublishDefaultPerS float64 `json:"publish_default_per_s"`
	// RelayAlwaysPerS and RelayDefaultPerS: the relay draining a backlog
	// of Events events (as RelayResult.DrainPerS), events/s, on each.
	Events           int     `json:"events"`
	RelayAlwaysPerS  float64 `json:"relay_always_per_s"`
	RelayDefaultPerS float64 `json:"relay_default_per_s"`
	// RelayVerifyingPerS: the same drain (sync always) while outbox.Verify
	// passes (gap check, 1000 rows read back) run back to back over what
	// it has published: far more than the relay's one pass every 10 s.
	RelayVerifyingPerS float64 `json:"relay_verifying_per_s"`
	VerifyPasses       int     `json:"verify_passes"`
	// VerifyReadBackPerS: one full pass (every row read back by sequence,
	// `tripsaga outbox verify`) over the backlog, rows/s.
	VerifyReadBackPerS float64 `json:"verify_read_back_per_s"`
}

// syncBench measures SyncResult; always is the scratch server that syncs
// always, dir a folder for the other one's store.
func syncBench(ctx context.Context, databaseURL string, always *server.Server, dir string, n int, pub time.Duration) (SyncResult, error) {
	res := SyncResult{Events: n}
	o := &server.Options{ServerName: "bench-scratch-default-sync", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: dir, NoSigs: true, NoLog: true} // nats-server's default sync: the comparison
	def, err := server.NewServer(o)
	if err != nil {
		return res, fmt.Errorf("bench: sync: %w", err)
	}
	go def.Start()
	defer func() { def.Shutdown(); def.WaitForShutdown() }()
	if !def.ReadyForConnections(30 * time.Second) {
		return res, fmt.Errorf("bench: sync: the default-sync server did not start")
	}
	if c := always.JetStreamConfig(); c == nil || !c.SyncAlways {
		return res, fmt.Errorf("bench: sync: the scratch server does not sync always")
	}
	if res.PublishAlwaysPerS, err = jsPublishPerS(ctx, always.ClientURL(), "", 512, pub); err != nil {
		return res, err
	}
	if res.PublishDefaultPerS, err = jsPublishPerS(ctx, def.ClientURL(), "", 512, pub); err != nil {
		return res, err
	}
	for _, c := range []struct {
		srv    *server.Server
		verify bool
		out    *float64
	}{{always, false, &res.RelayAlwaysPerS}, {def, false, &res.RelayDefaultPerS}, {always, true, &res.RelayVerifyingPerS}} {
		perS, passes, readBack, err := relayDrain(ctx, databaseURL, c.srv, n, c.verify)
		if err != nil {
			return res, err
		}
		*c.out = perS
		if c.verify {
			res.VerifyPasses, res.VerifyReadBackPerS = passes, readBack
		}
	}
	return res, nil
}

// relayDrain drains a backlog of n events to srv with one relay, with
// verify passes running back to back when verifying; then, when
// verifying, times one full read-back pass.
func relayDrain(ctx context.Context, databaseURL string, srv *server.Server, n int, verifying bool) (perS float64, passes int, readBackPerS float64, err error) {
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: sync: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: sync: %w", err)
	}
	if err := events.EnsureStreams(ctx, js, events.Default); err != nil {
		return 0, 0, 0, fmt.Errorf("bench: sync: %w", err)
	}
	pool, err := schemaPool(ctx, databaseURL, "bench_sync", 16, tripsql.SetSaga)
	if err != nil {
		return 0, 0, 0, err
	}
	defer pool.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: sync: %w", err)
	}
	if _, err := writeBacklog(ctx, pool, n, "s"); err != nil {
		return 0, 0, 0, err
	}
	vctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if verifying {
		wg.Go(func() {
			for vctx.Err() == nil {
				if _, err := outbox.Verify(vctx, pool, js, outbox.VerifyOptions{ReadBack: outbox.RelayVerifyBatchDefault, Again: time.Minute}); err == nil {
					passes++
				}
			}
		})
	}
	start := time.Now()
	got, err := drain(ctx, relay, 0)
	el := time.Since(start)
	stop()
	wg.Wait()
	if err != nil {
		return 0, 0, 0, err
	}
	if got < n {
		return 0, 0, 0, fmt.Errorf("bench: sync: relay published %d of %d events", got, n)
	}
	perS = round(float64(got)/el.Seconds(), 0)
	if verifying {
		start = time.Now()
		rep, err := outbox.Verify(ctx, pool, js, outbox.VerifyOptions{ReadBack: -1})
		if err != nil {
			return 0, 0, 0, fmt.Errorf("bench: sync: verify: %w", err)
		}
		if len(rep.Lost) > 0 {
			return 0, 0, 0, fmt.Errorf("bench: sync: verify found %d events lost on a server nobody touched", len(rep.Lost))
		}
		readBackPerS = round(float64(rep.ReadBack)/time.Since(start).Seconds(), 0)
	}
	return perS, passes, readBackPerS, nil
}
