package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/services/car"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/services/insurance"
	"github.com/tripsaga/tripsaga/services/payment"
	"github.com/tripsaga/tripsaga/services/trips"
	"github.com/tripsaga/tripsaga/sim"
)

// serveRunners runs each process of `tripsaga serve <name>` (the compose
// test asks them which variables they require).
func serveRunners() map[string]func(context.Context, process.Env) error {
	return map[string]func(context.Context, process.Env) error{
		"trips": trips.Run, "hotel": hotel.Run, "payment": payment.Run, "car": car.Run,
		"insurance": insurance.Run, "reconciler": reconciler.Run, "sim": serveSim,
	}
}

func serveCmd() *cobra.Command {
	runners := serveRunners()
	cmd := &cobra.Command{
		Use:       "serve <trips|hotel|payment|car|insurance|reconciler|sim>",
		Short:     "Run one process, configured by the environment (NATS_URL, DATABASE_URL, HTTP_ADDR, HOTEL_URL, PAYMENTS_URL, CARS_URL, MAIL_URL, INSURER_URL with STEPS naming insurance)",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"trips", "hotel", "payment", "car", "insurance", "reconciler", "sim"},
		RunE: func(cmd *cobra.Command, args []string) error {
			run, ok := runners[args[0]]
			if !ok {
				return fmt.Errorf("unknown process %q: want trips, hotel, payment, car, insurance, reconciler or sim", args[0])
			}
			env, err := process.EnvFromOS()
			if err != nil {
				return err
			}
			return run(cmd.Context(), env)
		},
	}
	cmd.AddCommand(serveNATSCmd()) // serve nats: one node of a JetStream cluster
	cmd.Flags().BoolVar(&simMemory, "memory", os.Getenv("SIM_MEMORY") == "1", "sim only: keep the companies' records in memory, lost at exit (default from SIM_MEMORY=1; the bench uses it)")
	return cmd
}

// simMemory is serve's --memory flag.
var simMemory bool //nolint:gochecknoglobals // a flag

// serveSim runs the four company simulators on HTTP_ADDR, under /hotel,
// /payments, /cars and /mail.
func serveSim(ctx context.Context, env process.Env) error {
	if err := env.Require("HTTP_ADDR"); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := env.Require("DATABASE_URL"); err != nil && !simMemory {
		return fmt.Errorf("sim: %w (or --memory)", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("service", "sim", "memory", simMemory)
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: env.DatabaseURL, Logger: log, Memory: simMemory})
	if err != nil {
		return err
	}
	defer sims.Close()
	mux := http.NewServeMux()
	mux.Handle("/", sims.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ready\n")) })
	mux.Handle("GET /metrics", promhttp.Handler())
	ln, err := process.Listen(env.HTTPAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { //nolint:gosec // shutdown after ctx ended: a fresh context bounds it
		<-ctx.Done()
		sims.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
