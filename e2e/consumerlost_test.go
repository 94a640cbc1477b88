package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

// consumersLost sums tripsaga_inbox_consumer_lost_total on a process's
// /metrics.
func consumersLost(t *testing.T, process string) float64 {
	t.Helper()
	resp, err := http.Get(sys.URL(process) + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tripsaga_inbox_consumer_lost_total{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		n += v
	}
	require.NoError(t, sc.Err())
	return n
}

// TestDeletedConsumersAreRecreated (issue 6, item 6) deletes every
// service's durable consumers (named after the service, one per stream it
// reads) one service after the other while trips are being booked: each
// service notices, counts it on /metrics, recreates its consumers and
// logs it at error level, and every trip ends confirmed, in the trips API
// and in the reconciler's view.
func TestDeletedConsumersAreRecreated(t *testing.T) {
	ctx := context.Background()
	nc, err := sys.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	services := []string{"hotel", "payment", "car", "trips", "reconciler"}
	before := map[string]float64{}
	for _, s := range services {
		before[s] = consumersLost(t, s)
	}

	// Trips are booked all along, one every 20 ms, until the deletions
	// are done.
	var (
		mu   sync.Mutex
		ids  []string
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			body := strings.Replace(validTrip, "ada@example.com", fmt.Sprintf("lost%d@example.com", i), 1)
			req, err := http.NewRequest(http.MethodPost, sys.URL("trips")+"/trips", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Prefer", "wait=0")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			var out map[string]any
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusAccepted {
				t.Errorf("POST /trips: %d %v", resp.StatusCode, err)
				return
			}
			mu.Lock()
			ids = append(ids, out["trip_id"].(string))
			mu.Unlock()
		}
	}()
	booked := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ids)
	}

	for _, service := range services {
		n := booked()
		testenv.Eventually(t, func() bool { return booked() >= n+5 }, "trips are booked before %s's consumers go", service)
		var deleted []string
		for _, stream := range []string{events.StreamTrips, events.StreamHotel, events.StreamPayment, events.StreamCar} {
			err := js.DeleteConsumer(ctx, stream, service)
			if err == nil {
				deleted = append(deleted, stream)
				continue
			}
			require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "%s on %s", service, stream)
		}
		require.NotEmpty(t, deleted, "%s has durable consumers", service)
		for _, stream := range deleted {
			testenv.Eventually(t, func() bool {
				_, err := js.Consumer(ctx, stream, service)
				return err == nil
			}, "%s recreates its consumer on %s", service, stream)
		}
		testenv.Eventually(t, func() bool { return consumersLost(t, service) >= before[service]+float64(len(deleted)) },
			"%s counts its %d lost consumers", service, len(deleted))
		testenv.Eventually(t, func() bool {
			b, err := os.ReadFile(sys.LogPath(service))
			return err == nil && strings.Contains(string(b), `level=ERROR msg="inbox: durable consumer lost`)
		}, "%s logs the loss at error level", service)
	}
	n := booked()
	testenv.Eventually(t, func() bool { return booked() >= n+5 }, "trips are booked after the last deletion")
	close(stop)
	<-done

	mu.Lock()
	all := append([]string(nil), ids...)
	mu.Unlock()
	get := func(url string) map[string]any {
		resp, err := http.Get(url)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return v
	}
	for _, id := range all {
		testenv.Eventually(t, func() bool {
			return get(sys.URL("trips") + "/trips/" + id)["status"] == "confirmed"
		}, "trip %s ends confirmed", id)
		testenv.Eventually(t, func() bool {
			return get(sys.URL("reconciler") + "/view/" + id)["settled"] == "confirmed"
		}, "the reconciler sees trip %s confirmed", id)
	}
	t.Logf("%d trips booked while the consumers of %v were deleted; all confirmed", len(all), services)
}
