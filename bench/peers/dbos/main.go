// Command dbos-peer is tripsaga's trip saga written with DBOS Transact for
// Go (github.com/dbos-inc/dbos-transact-golang): one process, one workflow
// per trip checkpointed in PostgreSQL, no broker. `tripsaga bench --peer
// dbos` builds and runs it beside tripsaga on the same durable PostgreSQL
// cluster and the same company simulators, and measures both the same way.
//
// The workflow (saga.go) holds the hotel, charges the card and books the
// car, one HTTP call each to the companies of docs/contracts/providers.md
// with the Idempotency-Key <trip>:hotel, <trip>:charge, <trip>:car; on a
// business rejection (409 sold out, 402 declined, 422) it releases,
// refunds, cancels what was done, newest first, by the same keys; then it
// mails the traveler (<trip>:mail:confirmed or <trip>:mail:canceled). An
// unknown outcome (5xx, no answer) is asked again by key (a step retry,
// the same request and key) until the step's deadline; an undo and the
// mail are retried until they succeed.
//
// Environment: DATABASE_URL (DBOS's system database, postgres://...),
// HTTP_ADDR (host:port; port 0 takes a free one), HOTEL_URL, PAYMENTS_URL,
// CARS_URL, MAIL_URL. Once serving it prints one JSON line
// {"addr":"host:port"} on stdout; it stops on SIGTERM or SIGINT.
//
// HTTP, the subset of tripsaga's trips API (docs/contracts/trips-api.md)
// the bench uses:
//
//	POST /trips            Idempotency-Key required; the trip's id is
//	                       derived from it (a repeat starts nothing new).
//	                       Prefer: wait=N (s, at most 60): 201 with
//	                       {"trip_id","status","reason"} when the workflow
//	                       ends within N s, else 202 {"status":"pending"}.
//	GET /trips/{id}        200 {"trip_id","status"}; 404 when unknown.
//	GET /trips?status=S    pending: workflows not finished; canceling:
//	                       always empty (a compensating workflow is pending).
//	GET /healthz           200 once DBOS is launched.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(log); err != nil {
		log.Error("dbos-peer", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	env := map[string]string{}
	for _, k := range []string{"DATABASE_URL", "HTTP_ADDR", "HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL"} {
		v := os.Getenv(k)
		if v == "" {
			return fmt.Errorf("%s: required", k)
		}
		env[k] = strings.TrimRight(v, "/")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	dctx, err := dbos.NewContext(ctx, dbos.Config{AppName: "tripsaga-dbos-peer", DatabaseURL: env["DATABASE_URL"], Logger: log})
	if err != nil {
		return fmt.Errorf("dbos: %w", err)
	}
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second}
	cs := &companies{hotel: env["HOTEL_URL"], payments: env["PAYMENTS_URL"], cars: env["CARS_URL"], mail: env["MAIL_URL"],
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, log: log}
	dbos.RegisterWorkflow(dctx, cs.tripWorkflow, dbos.WithWorkflowName("trip"))
	if err := dbos.Launch(dctx); err != nil {
		return fmt.Errorf("dbos launch: %w", err)
	}
	defer func() { _ = dbos.Shutdown(dctx, 10*time.Second) }() // exiting: nothing to do with its error

	l, err := net.Listen("tcp", env["HTTP_ADDR"])
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: (&front{d: dctx, cs: cs}).mux(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	b, _ := json.Marshal(map[string]string{"addr": l.Addr().String()})
	fmt.Printf("%s\n", b)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// front is the HTTP front of the workflows.
type front struct {
	d  dbos.Context
	cs *companies
}

func (f *front) mux() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("POST /trips", f.post)
	m.HandleFunc("GET /trips/{id}", f.get)
	m.HandleFunc("GET /trips", f.list)
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, map[string]string{"status": "ok"}) })
	return m
}

// tripID derives the trip's id (the workflow's id) from the client's
// Idempotency-Key: a repeated POST finds the same workflow.
func tripID(key string) string {
	h := sha256.Sum256([]byte(key))
	return "D-" + hex.EncodeToString(h[:10])
}

func (f *front) post(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 200 {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "Idempotency-Key: required, at most 200 characters"})
		return
	}
	var req TripRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
		return
	}
	if err := req.check(); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": err.Error()})
		return
	}
	wait := 0
	if p := r.Header.Get("Prefer"); strings.HasPrefix(p, "wait=") {
		n, err := strconv.Atoi(strings.TrimPrefix(p, "wait="))
		if err != nil || n < 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "Prefer: want wait=N, N seconds from 0 to 60"})
			return
		}
		wait = min(n, 60)
	}
	id := tripID(key)
	h, err := dbos.RunWorkflow(f.d, f.cs.tripWorkflow, TripInput{TripID: id, Request: req}, dbos.WithWorkflowID(id))
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if wait > 0 {
		res, err := h.GetResult(dbos.WithHandleTimeout(time.Duration(wait) * time.Second))
		if err == nil {
			writeJSON(w, http.StatusCreated, res)
			return
		}
	}
	writeJSON(w, http.StatusAccepted, TripResult{TripID: id, Status: "pending"})
}

func (f *front) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	h, err := dbos.RetrieveWorkflow[TripResult](f.d, id)
	if err != nil {
		var de *dbos.Error
		if errors.As(err, &de) && de.Code == dbos.ErrorCodeNonExistentWorkflow {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "trip " + id + ": not found"})
			return
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	st, err := h.GetStatus()
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if st.Status != dbos.WorkflowStatusSuccess {
		writeJSON(w, http.StatusOK, TripResult{TripID: id, Status: "pending"})
		return
	}
	res, err := h.GetResult()
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (f *front) list(w http.ResponseWriter, r *http.Request) {
	status := r.URL.Query().Get("status")
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "limit: want an integer from 1 to 1000"})
			return
		}
		limit = n
	}
	items := []TripResult{}
	switch status {
	case "pending":
		wfs, err := dbos.ListWorkflows(f.d, dbos.WithFilterStatus(dbos.WorkflowStatusPending, dbos.WorkflowStatusEnqueued),
			dbos.WithFilterLimit(limit), dbos.WithFilterLoadInput(false), dbos.WithFilterLoadOutput(false))
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		for _, wf := range wfs {
			items = append(items, TripResult{TripID: wf.ID, Status: "pending"})
		}
	case "canceling":
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "status: want pending or canceling"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
