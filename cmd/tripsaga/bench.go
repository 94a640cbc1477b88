package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/stack"
)

func benchCmd() *cobra.Command {
	var n, conc int
	var tripsURL string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Book many trips at once and print throughput (trips/s) and answer latency (ms)",
		Long: `bench starts the whole system (as up does; or uses --trips-url of a running
one), books --trips trips from --concurrency clients with Prefer: wait=60,
and prints how many were confirmed, the throughput in trips per second, and
the answer time percentiles in ms. Every trip must end confirmed.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if tripsURL == "" {
				dir, err := os.MkdirTemp("", "tripsaga-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				s, err := stack.Start(ctx, stack.Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
				if err != nil {
					return err
				}
				defer s.Stop()
				tripsURL = s.URL("trips")
			}
			return runBench(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), tripsURL, n, conc)
		},
	}
	cmd.Flags().IntVar(&n, "trips", 500, "trips to book")
	cmd.Flags().IntVar(&conc, "concurrency", 32, "clients booking at once")
	cmd.Flags().StringVar(&tripsURL, "trips-url", "", "trips API of a running system (default: start one)")
	return cmd
}

func runBench(ctx context.Context, out, errw io.Writer, url string, n, conc int) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}, Timeout: 90 * time.Second}
	bar := progressbar.NewOptions(n, progressbar.OptionSetWriter(errw), progressbar.OptionSetDescription("booking"), progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	statuses := map[string]int{}
	var failed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) || ctx.Err() != nil {
					return
				}
				req := events.TripRequest{
					Traveler: events.Person{Name: "Bench", Email: fmt.Sprintf("bench%d@example.com", i)},
					Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: "2026-12-18", Nights: 2},
					Car:      events.CarRequest{CarClass: "compact", Pickup: "2026-12-18", Return: "2026-12-20"},
					Payment:  events.PaymentRequest{CardToken: "tok_bench", AmountCents: 33000, Currency: "USD"},
				}
				body, _ := json.Marshal(req)
				hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/trips", bytes.NewReader(body))
				hr.Header.Set("Prefer", "wait=60")
				t0 := time.Now()
				resp, err := client.Do(hr)
				if err != nil {
					failed.Add(1)
					continue
				}
				var trip struct {
					Status string `json:"status"`
				}
				_ = json.NewDecoder(resp.Body).Decode(&trip)
				resp.Body.Close()
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				statuses[trip.Status]++
				mu.Unlock()
				_ = bar.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	_ = bar.Finish()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	fmt.Fprintf(out, "trips: %d in %.2f s with %d clients: %.1f trips/s\n", n, elapsed.Seconds(), conc, float64(len(lat))/elapsed.Seconds())
	fmt.Fprintf(out, "answers: %v, request errors: %d\n", statuses, failed.Load())
	fmt.Fprintf(out, "answer ms: p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", pct(0.50), pct(0.90), pct(0.99), pct(1))
	if statuses["confirmed"] != n {
		return fmt.Errorf("%d of %d trips confirmed", statuses["confirmed"], n)
	}
	return nil
}
