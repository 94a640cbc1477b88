package process

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga"
)

// HandleOps serves the step log for operators: GET /incidents (each
// with its owner, and when an open one escalates: see [Env.Owner],
// [Env.EscalateAfter]) and
// GET /steps/{trip_id}, as JSON {"items":[...]}; GET /steps?open=1
// (&after_trip=T&after_step=S&limit=N, 1 to saga.MaxOpenStepsPage,
// default 1000): every unfinished step, in (trip, step) order, as
// {"items":[saga.OpenStep...],"last":true when no page follows}; and GET
// /operator/{trip_id}: the operators' actions this service carried out for
// the trip, with what each did ({"items":[saga.OperatorEntry...]}), and
// whether its company calls are paused ("paused", "paused_by",
// "pause_reason"). A trip id that cannot be
// one (see events.ValidateTripID: a NUL, a byte that is not UTF-8, a
// space...) answers 404 problem+json; PostgreSQL unreachable answers 503
// (see [WriteError]).
func (p *Process) HandleOps() {
	p.Mux.HandleFunc("GET /incidents", func(w http.ResponseWriter, r *http.Request) {
		items, err := saga.Incidents(r.Context(), p.Pool)
		if err != nil {
			WriteError(w, r, p.Log, "incidents", err)
			return
		}
		var now time.Time // the database's clock, as the gauges
		if err := p.Pool.QueryRow(r.Context(), `SELECT now()`).Scan(&now); err != nil {
			WriteError(w, r, p.Log, "incidents", err)
			return
		}
		owner, after := p.Env.Owner(p.Name), p.Env.EscalateAfter()
		for i := range items {
			in := &items[i]
			in.Owner = owner
			if in.ResolvedAt == nil {
				at := in.RaisedAt.Add(after)
				in.EscalatesAt, in.Escalated = &at, !now.Before(at)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	})
	p.Mux.HandleFunc("GET /steps", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("open") != "1" {
			WriteProblem(w, Problem{Type: ProblemInvalidInput, Title: "Invalid query", Status: http.StatusBadRequest,
				Detail: "open: only open=1 is served (the unfinished steps); one trip's steps are at /steps/{trip_id}"})
			return
		}
		limit := 1000
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > saga.MaxOpenStepsPage {
				WriteProblem(w, Problem{Type: ProblemInvalidInput, Title: "Invalid query", Status: http.StatusBadRequest,
					Detail: fmt.Sprintf("limit: a whole number from 1 to %d", saga.MaxOpenStepsPage)})
				return
			}
			limit = n
		}
		items, err := saga.OpenSteps(r.Context(), p.Pool, q.Get("after_trip"), q.Get("after_step"), limit)
		if err != nil {
			WriteError(w, r, p.Log, "open steps", err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items, "last": len(items) < limit})
	})
	p.Mux.HandleFunc("GET /steps/{trip_id}", func(w http.ResponseWriter, r *http.Request) {
		trip := r.PathValue("trip_id")
		if events.ValidateTripID(trip) != nil {
			WriteNotFound(w, r, "No such trip: not a trip id")
			return
		}
		items, err := saga.Steps(r.Context(), p.Pool, trip)
		if err != nil {
			WriteError(w, r, p.Log, "steps", err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	})
	p.Mux.HandleFunc("GET /operator/{trip_id}", func(w http.ResponseWriter, r *http.Request) {
		trip := r.PathValue("trip_id")
		if events.ValidateTripID(trip) != nil {
			WriteNotFound(w, r, "No such trip: not a trip id")
			return
		}
		items, err := saga.OperatorLog(r.Context(), p.Pool, trip)
		if err != nil {
			WriteError(w, r, p.Log, "operator log", err)
			return
		}
		paused, by, why, err := saga.Paused(r.Context(), p.Pool, trip)
		if err != nil {
			WriteError(w, r, p.Log, "operator log", err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items, "paused": paused, "paused_by": by, "pause_reason": why})
	})
}
